// main() of the DeviceMemory test binaries: `<binary> --ipc-child ARGS...` runs the child side
// of the two-process IPC test (a fresh process, as CUDA needs); anything else runs the tests.
#include <gtest/gtest.h>

#include <cstring>

#include "ipc_child.h"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--ipc-child") == 0) {
    return kvcache::gpu::test::RunIpcChild(argc - 2, argv + 2);
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
