// The GPU half of the direct launch (python_module.cpp parses Python's arguments): one compiled
// Triton kernel to the driver, on the stream the caller passes. One source for nvcc and hipcc.
#include "launch/direct_launch.h"

#include <cstddef>
#include <cstdint>

#include "launch/driver.h"
#include "polykernels/portable.h"

namespace {

int launch_on_stream(void* function, const unsigned* grid, unsigned threads, unsigned shared_bytes, void* stream,
                     uint64_t* values, void** parameters, size_t count) {
  return polykernels::driver::launch(function, grid, threads, shared_bytes, static_cast<pk_stream_t>(stream), values,
                                     parameters, count, -1);
}

// Set when the library loads, before Python imports it as a module.
const bool registered = (polykernels::direct_launch = &launch_on_stream, true);

}  // namespace
