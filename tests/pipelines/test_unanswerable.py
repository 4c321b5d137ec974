import pytest

from pipelines.settings import RagSettings
from pipelines.unanswerable import UnanswerableDetector

DETECTOR = UnanswerableDetector(RagSettings().unanswerable_patterns)


@pytest.mark.parametrize(
    "reply",
    [
        "unanswerable",
        "Unanswerable.",
        "  **UNANSWERABLE**  ",
        "The question is unanswerable from the given passages.",
        "I cannot answer this based on the passages provided.",
        "The passages do not contain information about the warranty period.",
        "This is not mentioned in the context.",
        "There is insufficient information to say.",
        "There is no specific mention of a warranty clause in the provided context.",
        "Based on the provided context, there is no information about the delivery date.",
        "There is not enough information in the passage to tell why she left.",
        "I am sorry, but the provided context does not contain the company's order history.",
        "The transcript does not provide figures for net debt.",
        "It is not specified in the provided information.",
        "无法回答",
        "根据提供的材料，无法确定合同的签署日期。",
        "文中没有提及该条款。",
        "",
        "   \n",
        None,
    ],
)
def test_refusals_are_detected(reply):
    assert DETECTOR.is_unanswerable(reply)


@pytest.mark.parametrize(
    "reply",
    [
        "The answer is not unusual: the fee is $500.",
        "The pump stops 30 seconds after the float drops.",
        "The contract cannot be assigned without prior written consent.",
        "The seller was unable to find a buyer before the deadline.",
        "Losses that cannot be determined in advance are excluded.",
        "It was not provided until 2019, when the board approved it.",
        "There is no limit on renewals; Section 4 allows unlimited extensions.",
        "No information may be disclosed to third parties without consent (Section 9).",
        "合同于2020年签署，有效期三年。",
        "The term is five years. " + "Further detail follows. " * 20 + "The text does not mention renewal.",
    ],
)
def test_answers_are_not_refusals(reply):
    assert not DETECTOR.is_unanswerable(reply)


def test_custom_patterns_replace_defaults():
    detector = UnanswerableDetector([r"^no idea$"])
    assert detector.is_unanswerable("No idea")
    assert not detector.is_unanswerable("unanswerable as stated")  # only the configured patterns apply
