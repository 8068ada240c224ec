"""The draft/verify loop, free of torch and Triton (numpy only).

Written once; driven in-process by the reference runtime and, behind Triton, by the BLS model.
"""
