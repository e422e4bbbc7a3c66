// An uninitialized per-call buffer for the packed copies of K and V (packed_kv.h, panel_kv.h): megabytes
// that every call allocates, fills once and frees. With malloc such a buffer comes either from a fresh mmap
// (a page fault and a page zeroing per 4 KiB, thousands per call, in the kernel's time) or from heap memory
// freed earlier, depending on glibc's adaptive mmap threshold, i.e. on what the process did before: the same
// call then costs more or less in different processes. On Linux a buffer of 2 MiB or more is its own
// 2 MiB-aligned mapping marked MADV_HUGEPAGE (honoured where transparent huge pages are "always" or
// "madvise"): every call faults in the same few huge pages, whatever the process's history.
#pragma once

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace attn_ops::cpu {

template <typename T>
class HugeBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "HugeBuffer holds plain values, never initialized");
  static constexpr size_t kHugePage = size_t(2) << 20;

 public:
  explicit HugeBuffer(int64_t n) : bytes_(static_cast<size_t>(n) * sizeof(T)) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes_ >= kHugePage) {
      map_bytes_ = bytes_ + kHugePage;  // room to align the start
      map_ = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      TORCH_CHECK(map_ != MAP_FAILED, "attn_ops: out of memory mapping ", map_bytes_, " bytes");
      const uintptr_t start = (reinterpret_cast<uintptr_t>(map_) + kHugePage - 1) / kHugePage * kHugePage;
      data_ = reinterpret_cast<T*>(start);
      madvise(data_, bytes_, MADV_HUGEPAGE);  // advice only: no huge pages is no error
      return;
    }
#endif
    data_ = static_cast<T*>(std::malloc(bytes_ > 0 ? bytes_ : 1));
    TORCH_CHECK(data_ != nullptr, "attn_ops: out of memory allocating ", bytes_, " bytes");
  }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
  ~HugeBuffer() {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (map_ != nullptr) {
      munmap(map_, map_bytes_);
      return;
    }
#endif
    std::free(data_);
  }
  T* data() { return data_; }
  const T* data() const { return data_; }

 private:
  size_t bytes_;
  void* map_ = nullptr;  // the mapping (2 MiB and up), else null: data_ is malloc's
  size_t map_bytes_ = 0;
  T* data_ = nullptr;
};

}  // namespace attn_ops::cpu
