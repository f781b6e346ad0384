"""The published gains the Lassen predictions are compared with (never fitted to): GPT-NeoX-20B
with ZeRO-1 on 192 V100, TFLOPS/GPU and samples/s of each compressed scheme over the
uncompressed baseline, as the paper reports them."""

from __future__ import annotations

PUBLISHED_GPUS = 192
# scheme -> (TFLOPS/GPU gain %, samples/s gain %); the paper's hybrid is ZHybrid
PUBLISHED = {"naive": (22.5, 23.6), "zhybrid": (17.3, 12.7)}
# (scheme, metric, gain %) one by one
TARGETS = tuple((scheme, metric, gain) for scheme, pair in PUBLISHED.items()
                for metric, gain in zip(("tflops", "samples"), pair, strict=True))
