"""Hardware from measurements: fit the kernel-time models of costmodel/terms/kernel_time.py to
microbenchmarks (and network levels to nccl-tests) and write them into a system file.
`mapsat calibrate` is the command line over `calibrate_system`."""

from costmodel.calibration.fit import Errors, FamilyFit
from costmodel.calibration.render import Calibration, calibrate_system

__all__ = ["Calibration", "Errors", "FamilyFit", "calibrate_system"]
