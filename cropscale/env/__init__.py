"""Facts about the machine and the checkout a measurement ran on (layer 1).

=========  =====================================================================
module     content
=========  =====================================================================
``peaks``  dense peak TFLOP/s per GPU family and dtype (for MFU)
``nvml``   NVML devices matched to CUDA devices by UUID; energy, power, clocks
``host``   git commit, library versions, host, device and environment records
=========  =====================================================================
"""
