// The direct launch's GPU half, as the Python module (python_module.cpp) finds it: GPU builds set
// it when the library loads (direct_launch.cu); a CPU build leaves it null.
#pragma once

#include <cstddef>
#include <cstdint>

namespace polykernels {

// (function, grid[3], threads, shared bytes, stream, values, parameters, count) -> the driver's
// error code (0: launched); driver.h's launch() says what values and parameters hold.
using DirectLaunchFn = int (*)(void*, const unsigned*, unsigned, unsigned, void*, uint64_t*, void**, size_t);

extern DirectLaunchFn direct_launch;

}  // namespace polykernels
