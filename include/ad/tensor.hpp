#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ad/allocator.hpp"
#include "ad/dtype.hpp"
#include "ad/error.hpp"
#include "ad/rng.hpp"
#include "ad/shape.hpp"

namespace ad {

// A block of device memory, freed through the allocator that made it.
class Storage {
 public:
  Storage(std::shared_ptr<Allocator> alloc, std::size_t bytes) : Storage(alloc, bytes, alloc->device()) {}
  Storage(std::shared_ptr<Allocator> alloc, std::size_t bytes, Device device)
      : alloc_(std::move(alloc)), bytes_(bytes), device_(device), data_(alloc_->allocate(bytes, device)) {}
  ~Storage() { alloc_->deallocate(data_, bytes_, device_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  // Changes with every write through Tensor's mutating API (data<T>() on a
  // non-const Tensor, fill, copy_from, mark_modified): a graph that computed
  // values from a leaf sees that the leaf changed and recomputes them.
  // Concurrent writers may lose increments; it still moves away from any
  // value a reader recorded, which is all it is for.
  std::uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void touch() const { version_.store(version_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  Device device() const { return device_; }
  const std::shared_ptr<Allocator>& allocator() const { return alloc_; }

 private:
  std::shared_ptr<Allocator> alloc_;
  std::size_t bytes_;
  Device device_;
  void* data_;
  mutable std::atomic<std::uint64_t> version_{0};
};

// A dense, contiguous (row-major) n-d array. Copies of a Tensor share its
// storage (like std::shared_ptr); clone() makes an independent copy.
class Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() == false

  // Uninitialised memory. `alloc` defaults to default_allocator(device).
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(),
                      std::shared_ptr<Allocator> alloc = nullptr);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32);
  static Tensor ones(const Shape& shape, DType dtype = DType::f32);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32);
  // Values copied from `values` (numel must equal shape.numel()).
  static Tensor from(std::span<const float> values, const Shape& shape);
  static Tensor from(std::span<const double> values, const Shape& shape);
  static Tensor from(std::span<const std::int64_t> values, const Shape& shape);
  // Standard normal * stddev + mean, drawn from rng (Box-Muller: consumes
  // 2 numel counters).
  static Tensor randn(const Shape& shape, Rng& rng, DType dtype = DType::f32, double mean = 0, double stddev = 1);
  // Uniform in (lo, hi], drawn from rng.
  static Tensor uniform(const Shape& shape, Rng& rng, DType dtype = DType::f32, double lo = 0, double hi = 1);
  // Uniform integers in [0, n), dtype i64.
  static Tensor randint(const Shape& shape, Rng& rng, std::int64_t n);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  std::int64_t dim(int i) const;  // negative i counts from the end
  std::int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Typed access; throws ad::Error if T does not match dtype().
  // The non-const form counts as a write (Storage::version): a graph that
  // computed values from this tensor recomputes them at its next eval or
  // backward. Writes through raw() are not seen: call mark_modified().
  template <class T> T* data() { check_type(DTypeOf<T>::value); mark_modified(); return static_cast<T*>(raw()); }
  template <class T> const T* data() const { check_type(DTypeOf<T>::value); return static_cast<const T*>(raw()); }
  void* raw() const { return storage_ ? static_cast<char*>(storage_->data()) + offset_ : nullptr; }
  // Tells graphs that use this tensor as a leaf that its values changed
  // (after writing through raw(); data<T>(), fill and copy_from do it).
  void mark_modified() const { if (storage_) storage_->touch(); }
  // Byte offset of element 0 in the storage (non-zero only for part views).
  std::size_t storage_offset() const { return offset_; }

  // The value of a one-element tensor, converted to double. item, to_vector,
  // at and fill work on any device (through a host copy for a GPU tensor).
  double item() const;
  // All values converted to double (any dtype).
  std::vector<double> to_vector() const;
  // Element at a multi-index, converted to double.
  double at(std::initializer_list<std::int64_t> index) const;

  // Same storage, new shape (numel must match). A view: writes show in both.
  Tensor reshape(const Shape& shape) const;
  // A view of numel(shape) elements starting at element `offset` of this
  // tensor's flat order (how one buffer carries several outputs of an op).
  Tensor view(std::int64_t offset, const Shape& shape) const;
  // Rows [begin, begin + count) along dim 0, as a view (a mini-batch of a
  // dataset tensor, no copy). Throws ad::Error for rank 0 or a range outside
  // [0, dim 0).
  Tensor rows(std::int64_t begin, std::int64_t count) const;
  Tensor clone(std::shared_ptr<Allocator> alloc = nullptr) const;
  // Converted copy (f32/f64/f16/bf16/i64 in any direction), on the same device.
  Tensor to(DType dtype) const;
  // Copy on another device (a CPU tensor to Device::cuda(i) and back).
  // Throws ad::Error if the device cannot be used (see ad::cuda::require).
  Tensor to(Device device) const;
  bool is_cuda() const { return device().kind == DeviceKind::cuda; }
  void fill(double value);  // an i64 tensor: an integer within its range (else ad::Error)
  // Copies values from `src` (same shape; converted if dtypes differ).
  void copy_from(const Tensor& src);
  bool same_storage(const Tensor& o) const { return storage_ && storage_ == o.storage_; }

 private:
  void check_type(DType t) const;
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::f32;
  std::size_t offset_ = 0;
};

// True when shapes, dtypes and every bit of the values agree.
bool bitwise_equal(const Tensor& a, const Tensor& b);

}  // namespace ad
