"""Using the model a site keeps: predict on new rows or images, export to ONNX with a model card.

A run folder (or a site's own folder) holds, per client k, ``client{k}_{role}.safetensors`` + ``.json`` (the
architecture) and ``client{k}_preprocessing.json`` (how that site turned raw rows or images into inputs).
:func:`load_pipeline` rebuilds raw input → preprocessing → model → class probabilities as one torch module;
``silofl predict`` runs it, ``silofl export`` writes it as ONNX, so both apply the preprocessing exactly as
training did.
"""

from silofl.inference.pipeline import Pipeline, load_pipeline
from silofl.inference.predict import predict

__all__ = ["Pipeline", "load_pipeline", "predict"]
