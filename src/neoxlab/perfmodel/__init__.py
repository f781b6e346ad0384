"""Performance model: step time, TFLOPS/GPU and samples/s of a layout, predicted not run.

Kept free of imports so that neoxlab.config can import the profile schema from here.
"""
