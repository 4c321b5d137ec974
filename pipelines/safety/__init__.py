"""Defence layers for untrusted document text and generated answers: injection scanning and grounding checks."""
