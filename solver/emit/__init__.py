"""Launch settings: rank layout and process groups, and each framework's settings for a plan.

The names below are plain constants so that the command line can offer them without importing
numpy (`parplan --help` stays fast); the modules of this package hold the logic.

TARGETS: the framework versions each format's emitter writes for, newest first (the default,
the newest release that installs on Python 3.10-3.12); `launch --target FORMAT@VERSION` picks
another. tests/test_launch_frameworks.py feeds the files to these very versions (the
`frameworks` extra installs them; CI runs it).
"""

FORMATS = ("groups", "torch", "megatron", "megatron-bridge", "torchtitan", "torchtitan-python",
           "deepspeed", "vllm")
# Other names a user may give for a format (--format, --target).
FORMAT_ALIASES = {"bridge": "megatron-bridge"}
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
TARGETS: dict[str, tuple[str, ...]] = {
    "megatron": ("core_v0.16",),
    "megatron-bridge": ("0.3",),
    "torchtitan": ("0.3", "0.2"),
    "torchtitan-python": ("0.3",),
    "deepspeed": ("0.19",),
    "vllm": ("0.33",),
}
