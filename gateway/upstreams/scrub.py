"""Secrets, tracebacks and file paths taken out of upstream error text before it reaches a client, the log or the
ledger's `error` column.

An upstream's error message is the provider's text: "Incorrect API key provided: sk-...", a litellm message with a
whole traceback (file paths of the gateway's install included), a proxy echoing the Authorization header. What stays
is what helps the client: the provider's complaint, without key-shaped strings (sk-..., sk-ant-..., Bearer tokens,
AWS keys, ...), without the values of the gateway's own configured keys (any environment variable whose name says it
holds a secret, and the policy's `api_key_env`), and cut before any traceback.
"""

from __future__ import annotations

import os
import re

REDACTED = "<redacted>"
# Key-shaped strings, by the providers' published formats: OpenAI (sk-, sk-proj-), Anthropic (sk-ant-), this gateway's
# own named keys (sr-), AWS access key ids and secret keys, Google API keys, Hugging Face, GitHub, Slack, JWTs; and
# whatever follows "Bearer", "api_key=", "x-api-key:" and the like.
_KEY_SHAPED = re.compile(
    r"""
    \b(?:sk|sr|rk|pk)-[A-Za-z0-9_\-]{8,}             # OpenAI / Anthropic / gateway keys
    | \b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}\b  # AWS access key ids
    | \bAIza[0-9A-Za-z_\-]{30,}                         # Google API keys
    | \bhf_[A-Za-z0-9]{20,}                             # Hugging Face tokens
    | \bgh[pousr]_[A-Za-z0-9]{20,}                      # GitHub tokens
    | \bxox[abprs]-[A-Za-z0-9\-]{10,}                   # Slack tokens
    | \beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}  # JWTs
    """,
    re.VERBOSE,
)
# a label that announces a secret, then the secret (quoted or not)
_LABELLED = re.compile(
    r"""(?ix)
    (\b(?:bearer|basic)\s+
     | \b(?:token|api[_\-\s]?key|x-api-key|x-goog-api-key|authorization|secret(?:[_\-]access)?[_\-]?key
        |access[_\-]?token|password|passwd|credentials?|signature)["']?\s*(?:[:=]|\bis\b)\s*["']?
        (?:(?:bearer|basic)\s+)?)
    (?!<redacted>)([^\s"',;}{)\]]{6,})
    """
)
# a 40-character AWS secret access key standing alone
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|\n\s*File \"", re.IGNORECASE)
_FILE_LINE = re.compile(r"File \"[^\"]*\"(?:, line \d+)?(?:, in \S+)?")
# an absolute path of two or more parts (/work/.venv/lib/..., C:\Users\...), or ~/...
_PATH = re.compile(r"(?<![\w.:/])(?:~|[A-Za-z]:\\|/)(?:[\w.\-@+]+[/\\])+[\w.\-@+]*")
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
MIN_SECRET_CHARS = 8  # shorter values ("1", "true") would redact ordinary words


def _random_looking(match: re.Match) -> str:
    """A 40-character run with upper and lower case letters and digits, as AWS secret keys are (a hex digest is not)."""
    value = match.group(0)
    mixed = any(c.isupper() for c in value) and any(c.islower() for c in value) and any(c.isdigit() for c in value)
    return REDACTED if mixed else value


def configured_secrets(extra_env: tuple[str, ...] = ()) -> list[str]:
    """The values of the environment variables that hold secrets (by their names), and of those named in
    extra_env (a policy's api_key_env), longest first so a key is never half replaced by a shorter one."""
    values = {
        value
        for name, value in os.environ.items()
        if (name in extra_env or _SECRET_NAME.search(name)) and len(value) >= MIN_SECRET_CHARS
    }
    return sorted(values, key=len, reverse=True)


def scrub(text: str, extra_env: tuple[str, ...] = ()) -> str:
    """Text from an upstream with no secret, traceback or file path in it."""
    text = str(text)
    for secret in configured_secrets(extra_env):
        if secret in text:
            text = text.replace(secret, REDACTED)
    cut = _TRACEBACK.search(text)
    if cut:
        text = text[: cut.start()].rstrip() + " (traceback left out)"
    text = _FILE_LINE.sub("<file>", text)
    text = _PATH.sub("<path>", text)
    text = _KEY_SHAPED.sub(REDACTED, text)
    text = _LABELLED.sub(lambda m: m.group(1) + REDACTED, text)
    text = _AWS_SECRET.sub(_random_looking, text)
    return text
