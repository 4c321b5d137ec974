import os

# Offline, always: no hub downloads, no remote litellm cost map.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
for name in ("SELFROUTE_API_KEYS", "SELFROUTE_ADMIN_KEY", "SELFROUTE_DATA_DIR", "SELFROUTE_STORE_URI", "OPENAI_API_BASE",
             "OPENAI_BASE_URL"):
    os.environ.pop(name, None)
