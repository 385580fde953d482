// A CUDA device for a CPU-only torch build, so that `python -m scripts.gpu_dryrun` can compile a
// training step's CUDA graphs on a machine without a GPU (scripts/gpu_dryrun/__init__.py).
//
// Loaded with LD_PRELOAD, before torch is imported: torch reads its CUDA hooks once, at import.
// - Hooks and a device guard that say one CUDA device is there (autograd, streams, contexts).
// - An allocator of host memory for "cuda" tensors, with empty/copy/resize and the views, so
//   tensors on "cuda" exist, move to and from the CPU and alias as views do.
// - Every other op on "cuda" runs on the CPU over the same memory (torch's cpu_fallback),
//   except the matrix products, which only allocate their result: a compile check needs their
//   shapes, and CPU products at a GPU's sizes (FP8 ones above all) would take minutes.
// Nothing here launches GPU code: the Python side makes Triton's launches no-ops.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>
#include <torch/library.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace at {
struct FakeCUDAHooks : CUDAHooksInterface {
  FakeCUDAHooks(CUDAHooksArgs) {}
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  DeviceIndex deviceCount() const override { return 1; }
  DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(DeviceIndex) const override {}
  DeviceIndex exchangeDevice(DeviceIndex) const override { return 0; }
  DeviceIndex maybeExchangeDevice(DeviceIndex) const override { return 0; }
  bool hasCUDA() const override { return true; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  DeviceIndex current_device() const override { return 0; }
  int getNumGPUs() const override { return 1; }
  void deviceSynchronize(DeviceIndex) const override {}
};
C10_REGISTER_CLASS(CUDAHooksRegistry, CUDAHooks, FakeCUDAHooks)
}  // namespace at

C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>);

namespace {
void host_free(void* p) { std::free(p); }

// Kernel launches: every op this device's backend computes (a kernel each on a GPU), counted
// once at the outermost call (the CPU fallback's own copies in and out are not launches).
std::atomic<int64_t> launches{0};
thread_local int depth = 0;
struct Launch {
  Launch() { if (depth++ == 0) launches.fetch_add(1, std::memory_order_relaxed); }
  ~Launch() { --depth; }
};

struct HostAsCuda final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? std::malloc(n) : nullptr;
    return {p, p, &host_free, c10::Device(c10::DeviceType::CUDA, 0)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &host_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};
HostAsCuda host_as_cuda;

const c10::DispatchKeySet cuda_keys(c10::DispatchKey::CUDA);

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                         std::optional<c10::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &host_as_cuda, cuda_keys,
                                           dtype.value_or(at::get_default_dtype_as_scalartype()));
}

at::Tensor empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                 std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>,
                 std::optional<c10::MemoryFormat> mf) {
  return at::detail::empty_generic(size, &host_as_cuda, cuda_keys,
                                   dtype.value_or(at::get_default_dtype_as_scalartype()), mf);
}

// The same memory seen as a CPU tensor (sizes, strides, offset and dtype kept).
at::Tensor as_cpu(const at::Tensor& t) {
  if (t.is_cpu()) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), [](void*) {},
                       t.options().device(c10::kCPU));
}

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool) {
  Launch launch;
  as_cpu(self).copy_(as_cpu(src));
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  Launch launch;
  as_cpu(dst).copy_(as_cpu(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  Launch launch;
  if (!dst.sizes().equals(self.sizes())) dst.resize_(self.sizes());
  as_cpu(dst).copy_(as_cpu(self));
  return dst;
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> mf) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (mf.has_value()) impl->empty_tensor_restride(*mf);
  size_t need = (impl->numel() + impl->storage_offset()) * self.itemsize();
  if (impl->numel() > 0 && need > self.storage().nbytes())
  {
    auto* storage = self.storage().unsafeGetStorageImpl();
    c10::DataPtr fresh = host_as_cuda.allocate(need);
    if (storage->nbytes() > 0) std::memcpy(fresh.get(), storage->data(), storage->nbytes());
    storage->set_data_ptr_noswap(std::move(fresh));
    storage->set_nbytes(need);
  }
  return self;
}

// Products are not computed: only their shapes matter to a compile check, and a CPU product at
// a GPU's sizes (an FP8 one above all) would take minutes.
at::Tensor shaped(const at::Tensor& like, std::vector<int64_t> size,
                  std::optional<c10::ScalarType> dtype = std::nullopt) {
  return empty(size, dtype.value_or(like.scalar_type()), std::nullopt, std::nullopt,
               std::nullopt, std::nullopt);
}
at::Tensor& fit(at::Tensor& out, std::vector<int64_t> size) {
  if (!out.sizes().equals(size)) resize_(out, size, std::nullopt);
  return out;
}
at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  Launch launch;
  return shaped(a, {a.size(0), b.size(1)});
}
at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  Launch launch;
  return fit(out, {a.size(0), b.size(1)});
}
at::Tensor addmm(const at::Tensor&, const at::Tensor& a, const at::Tensor& b, const c10::Scalar&,
                 const c10::Scalar&) {
  Launch launch;
  return shaped(a, {a.size(0), b.size(1)});
}
at::Tensor& addmm_out(const at::Tensor&, const at::Tensor& a, const at::Tensor& b,
                      const c10::Scalar&, const c10::Scalar&, at::Tensor& out) {
  Launch launch;
  return fit(out, {a.size(0), b.size(1)});
}
at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  Launch launch;
  return shaped(a, {a.size(0), a.size(1), b.size(2)});
}
at::Tensor& bmm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  Launch launch;
  return fit(out, {a.size(0), a.size(1), b.size(2)});
}
at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor&, const at::Tensor&,
                     const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                     std::optional<c10::ScalarType> out_dtype, bool) {
  Launch launch;
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "_scaled_mm: shapes");
  TORCH_CHECK(a.is_contiguous() && b.t().is_contiguous(),
              "_scaled_mm: the first operand row-major and the second column-major");
  TORCH_CHECK(a.size(1) % 16 == 0 && b.size(1) % 16 == 0, "_scaled_mm: sizes divisible by 16");
  return shaped(a, {a.size(0), b.size(1)}, out_dtype.value_or(c10::kBFloat16));
}
// The out= form, which compiled code calls: the same checks, and the output only sized (its
// values would come from the CPU's reference FP8 kernel, minutes at a GPU's sizes).
at::Tensor& scaled_mm_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                          const at::Tensor& sb, const std::optional<at::Tensor>& bias,
                          const std::optional<at::Tensor>& scale_result,
                          std::optional<c10::ScalarType> out_dtype, bool fast, at::Tensor& out) {
  scaled_mm(a, b, sa, sb, bias, scale_result, out_dtype, fast);
  return fit(out, {a.size(0), b.size(1)});
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Launch launch;
  at::native::cpu_fallback(op, stack);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  Launch launch;
  return as_cpu(self).item();
}

}  // namespace

REGISTER_ALLOCATOR(c10::DeviceType::CUDA, &host_as_cuda);

// Read by scripts/gpu_dryrun/launches.py through ctypes.
extern "C" int64_t host_cuda_launches() { return launches.load(); }

TORCH_LIBRARY_IMPL(aten, CUDA, m) {
  m.impl("empty_strided", empty_strided);
  m.impl("empty.memory_format", empty);
  m.impl("copy_", copy_);
  m.impl("_copy_from", copy_from);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("resize_", resize_);
  m.impl("mm", mm);
  m.impl("mm.out", mm_out);
  m.impl("addmm", addmm);
  m.impl("addmm.out", addmm_out);
  m.impl("bmm", bmm);
  m.impl("bmm.out", bmm_out);
  m.impl("_scaled_mm", scaled_mm);
  m.impl("_scaled_mm.out", scaled_mm_out);
  // Views share the host memory: the device-independent implementations.
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
}

TORCH_LIBRARY_IMPL(_, CUDA, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}
