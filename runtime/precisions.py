"""The precisions a bundle's CPU graphs can be exported at (``kztts export --weights/--kv/--decoder``,
``kztts.export.variants``). The first of each is the plain fp32 export."""
from __future__ import annotations

WEIGHT_PRECISIONS = ("fp32", "int8", "int4")  # the Talker's and Code Predictor's MatMul weights
KV_PRECISIONS = ("fp32", "fp16")  # the KV-cache inputs/outputs of the Talker and cp_step
DECODER_PRECISIONS = ("fp32", "int8")  # the speech decoder's MatMul weights
