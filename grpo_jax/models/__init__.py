"""The policy and what feeds it: the transformer as a pure function of params (`model`),
quantisation, HF and GGUF import, tokenizers, the jitted sampler and refill, the mesh and
rules table (`sharding`), teacher-forced log-probs, frozen bases and shape checks.
"""
