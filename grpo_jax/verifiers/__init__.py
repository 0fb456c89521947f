"""Verifiers and how they run: the verdict types (`verdicts`), the worker pool that scores
completions with timeouts (`reward_pool`), the math verifier (`math_verify`, with its
answer extraction `math_extract`, normalisation `math_normalize`, parser `math_parse` and
equivalence `math_equiv`) and the code sandbox (`sandbox/`).
"""
