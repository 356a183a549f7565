"""A training iteration: pipeline stages, data parallelism, offload and the framework profiles.

    steptime           the step time of each candidate configuration
    stage_content      what each pipeline stage holds, for the step time
    layout_terms       one configuration's time and memory as coefficients of its layout
    data_parallel      data-parallel traffic and the optimizer step
    offload            what optimizer and activation offload to the host cost in time
    training_states    training states below mixed precision (`--training-states`)
    frameworks         framework profiles (`--framework`): TimeConstants and MemoryOptions
    recompute_modules  the module sets tried for selective recompute
    block_breakdown    a configuration's time and memory split by block kind
    caveats            what the step time knowingly leaves out, in words
"""
