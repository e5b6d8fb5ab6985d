"""Text-to-image diffusion models (SDXL, SD 1.5): pipeline, loader, and the UNet/VAE optimizations."""
