// The "raw managed" peer: a pluggable allocator that calls cudaMallocManaged
// and cudaFree for every request, with no caching. Loaded by
// torch.cuda.memory.CUDAPluggableAllocator(path, "raw_alloc", "raw_free").
#include <cuda_runtime_api.h>
#include <sys/types.h>

extern "C" {
void* raw_alloc(ssize_t size, int device, cudaStream_t stream) {
  (void)device;
  (void)stream;
  void* p = nullptr;
  if (cudaMallocManaged(&p, size, cudaMemAttachGlobal) != cudaSuccess) return nullptr;
  return p;
}
void raw_free(void* ptr, ssize_t size, int device, cudaStream_t stream) {
  (void)size;
  (void)device;
  (void)stream;
  cudaFree(ptr);
}
}
