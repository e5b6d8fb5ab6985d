"""Text-to-image diffusion (SDXL, SD 1.5): diffusers' model definitions and schedulers, tacit's pipeline.

Kept light on purpose: importing the package gives the request types only, so the server can
validate a request without importing torch or diffusers; the pipeline is tacit.diffusion.pipeline.
"""

from tacit.diffusion.request import ImageLimits, ImageRequest, ImageResult

__all__ = ["ImageLimits", "ImageRequest", "ImageResult"]
