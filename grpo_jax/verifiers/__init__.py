"""Verifiers and how they run: the verdict types (`verdicts`), the worker pool that scores
completions with timeouts (`reward_pool`), the math verifier (`math_verify`) and the code
sandbox (`sandbox/`).
"""
