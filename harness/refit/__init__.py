"""Refit primitives shared by the simulator and the GPU gates.

``comm_plan`` (which transport each target device gets) is pure Python and used by the
simulator and the gates alike; ``bucket_cache`` (the CPU bucket cache) needs torch and is
used by the gates. Import the submodule you need: importing this package pulls in nothing.
"""
