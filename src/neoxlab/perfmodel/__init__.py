"""Performance model: step time, TFLOPS/GPU and samples/s of a layout, predicted not run.

The hardware profile schema it reads lives with the config schema (neoxlab.config.profile).
"""
