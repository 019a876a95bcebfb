"""How a model runs: the device, the precision it computes in (and int8 quantization), and the one inference
set-up every verb uses."""
