import pytest

from pipelines.question import extract_question


def test_final_paragraph_is_the_question():
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Long report text.\n\nMore report text.\n\nWhat did the report conclude?"},
    ]
    question, context = extract_question(messages, None)
    assert question == "What did the report conclude?"
    assert context == "You are helpful.\n\nLong report text.\n\nMore report text."


def test_marker_takes_text_after_its_last_occurrence():
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Document: the Question: field is described here.\n\nBody."},
                {"type": "image_url", "image_url": {"url": "http://x"}},
                {"type": "text", "text": "question: When was it signed?\nwith which party?\n\nAnswer:"},
            ],
        }
    ]
    question, context = extract_question(messages, "Question:")
    assert question == "When was it signed?\nwith which party?"
    assert "Body." in context and "When was it signed" not in context


def test_marker_absent_falls_back_to_last_paragraph_and_keeps_earlier_turns():
    messages = [
        {"role": "user", "content": "Here is the contract: clause one."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Who pays the fees?"},
    ]
    question, context = extract_question(messages, "Question:")
    assert question == "Who pays the fees?"
    assert context == "Here is the contract: clause one.\n\nNoted."


def test_no_user_message_is_an_error():
    with pytest.raises(ValueError):
        extract_question([{"role": "system", "content": "x"}], None)
