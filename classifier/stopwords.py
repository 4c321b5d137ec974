"""The stop-word list both feature sets share: words that say nothing about whether a passage answers a question.

STOPWORDS is the common list (English function words and the vocabulary of exam-style prompts). The answer
features drop a few more words, ANSWER_STOPWORDS: the words answers and passages use to talk about the
document itself ("according to the passage", "the document states", "section 3"), which would otherwise count
as grounding in every passage. The pre-route features keep the shorter list on purpose: the shipped pre-route
model (classifier/models/default.skops) was trained on overlap features computed with it, and the shipped
verifier on the longer one, so unifying them would change the features, and the predictions, of one shipped
model. A retrain may choose one list for both.
"""

from __future__ import annotations

STOPWORDS = frozenset(
    "a an the of to in on at for by with from and or but not no is are was were be been being do does did "
    "has have had this that these those it its as into than then so such what which who whom whose when "
    "where why how can could should would will shall may might must there their they them he she his her "
    "we you your our i me my about over under between after before during all any each some more most "
    "other only own same very just also if while because until question answer following options option "
    "text passage according".split()
)
ANSWER_STOPWORDS = STOPWORDS | frozenset(
    "passages context provided given based information correct mentioned states stated document section parts "
    "part".split()
)
