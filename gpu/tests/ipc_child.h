// The child side of the two-process IPC test, shared by test_main.cc and device_suite.h.
#ifndef KVCACHE_GPU_TESTS_IPC_CHILD_H_
#define KVCACHE_GPU_TESTS_IPC_CHILD_H_

#include <memory>

#include "kvcache/gpu/device_memory.h"

namespace kvcache::gpu::test {

// The DeviceMemory under test; each test binary defines it.
std::unique_ptr<DeviceMemory> MakeTestDevice();

// `<binary> --ipc-child HEX OFFSET BYTES CHECKSUM`: maps the exported arena, copies the block
// device-to-device into its own arena, verifies it, writes back every byte XOR 0x5A. Exit code
// 0 on success, 10.. naming the step that failed.
int RunIpcChild(int argc, char** argv);

}  // namespace kvcache::gpu::test

#endif  // KVCACHE_GPU_TESTS_IPC_CHILD_H_
