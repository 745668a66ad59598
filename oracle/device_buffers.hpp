// Host images of a float64 problem's tensors, each followed by guard bytes, with a device copy
// each: what the workloads and problems of oracle/ share. The device copies (and the snapshots
// a reset restores) live as long as the DeviceBuffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ropejit::oracle {

class DeviceBuffers {
 public:
  struct Buffer {
    std::vector<uint8_t> host;  // the tensor's bytes, then the guard
    unsigned long long device = 0;
    unsigned long long initial = 0;  // keep_initial()'s copy of the device bytes
  };

  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers();

  // `host` with `guard` bytes of `poison` after it. The reference stays valid while this lives.
  Buffer& add(std::vector<uint8_t> host, size_t guard, uint8_t poison);
  // Allocates what is not on the device yet, then copies every host image there (poisoned
  // outputs and guards included, so an upload starts a call afresh).
  void upload();
  // b's device bytes, guard included.
  static std::vector<uint8_t> download(const Buffer& b);

  size_t size() const { return buffers_.size(); }
  Buffer& operator[](size_t i) { return *buffers_[i]; }
  const Buffer& operator[](size_t i) const { return *buffers_[i]; }
  // The buffer whose host image holds `host`; -1 for none.
  int index_of(const void* host) const;
  // The device address of a host pointer into one of the buffers (null for null).
  void* device_address(const void* host) const;

  // A second device copy of every buffer as it is now, for restore_initial(); false (and no
  // copy kept) when the device has no room for it.
  bool keep_initial();
  bool has_initial() const { return !buffers_.empty() && buffers_.front()->initial != 0; }
  // Every buffer's device bytes back to keep_initial()'s copy (on the legacy stream).
  void restore_initial();
  void drop_initial();

 private:
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

// b's device address; null for no buffer.
inline void* device_pointer(const DeviceBuffers::Buffer* b) {
  return b ? reinterpret_cast<void*>(static_cast<uintptr_t>(b->device)) : nullptr;
}

}  // namespace ropejit::oracle
