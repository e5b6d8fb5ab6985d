"""`tacit predict`: a roofline performance model of one engine step, per operator class.

model_shape (config.json -> shape numbers) -> operators (FLOPs and bytes per step) ->
roofline (time per operator on a HardwareSpec, with fitted efficiencies) -> predict (TTFT,
TPOT, memory); validate runs the real engine against it. Nothing imports this package but
the CLI.
"""
