"""Launch settings: rank layout and process groups, and each framework's settings for a plan.

The names below are plain constants so that the command line can offer them without importing
numpy (`parplan --help` stays fast); the modules of this package hold the logic.
"""

FORMATS = ("groups", "torch", "megatron", "torchtitan", "deepspeed", "vllm")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
