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
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <atomic>
#include <mutex>
#include <string>
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
  bool outer;
  Launch() : outer(depth++ == 0) {
    if (outer) launches.fetch_add(1, std::memory_order_relaxed);
  }
  ~Launch() { --depth; }
};

// The ledger (scripts/gpu_dryrun/ledger.py), while switched on: one line per outermost op,
// "op<TAB>dtype<TAB>FLOPs<TAB>bytes", where FLOPs are a product's multiply-adds times 2 (0 for
// every other op) and bytes are its tensors' as the op sees them: each input read once, each
// output written once (an in-place operand both; an out= buffer written only).
std::atomic<bool> keeping{false};
std::mutex ledger_mutex;
std::string ledger;

double bytes_of(const at::Tensor& t) {
  return t.defined() ? static_cast<double>(t.numel()) * t.element_size() : 0.0;
}
double bytes_of(const c10::IValue& v) {
  if (v.isTensor()) return bytes_of(v.toTensor());
  double sum = 0;
  if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorVector()) sum += bytes_of(t);
  else if (v.isList())
    for (const c10::IValue& e : v.toListRef())
      if (e.isTensor()) sum += bytes_of(e.toTensor());
  return sum;
}
void book(const Launch& launch, const std::string& op, c10::ScalarType dtype, double flops,
          double bytes, const std::string& dims = "") {
  if (!launch.outer || !keeping.load(std::memory_order_relaxed)) return;
  std::string line = op + "\t" + c10::toString(dtype) + "\t" + std::to_string(flops) + "\t" +
                     std::to_string(bytes) + "\t" + dims + "\n";
  std::lock_guard<std::mutex> lock(ledger_mutex);
  ledger += line;
}
// A product's line: 2·M·N·K (times the batch) FLOPs; its operands read, its result written
// (and a bias read); its dimensions "M,N,K", which name the model's part (ledger.py).
void book_product(const Launch& launch, const char* op, const at::Tensor& a, const at::Tensor& b,
                  const at::Tensor& out, const at::Tensor& bias = at::Tensor()) {
  double batch = a.dim() == 3 ? static_cast<double>(a.size(0)) : 1.0;
  int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  book(launch, op, a.scalar_type(), 2.0 * batch * m * n * k,
       bytes_of(a) + bytes_of(b) + bytes_of(out) + bytes_of(bias),
       std::to_string(m) + "," + std::to_string(n) + "," + std::to_string(k));
}

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
  book(launch, "copy_", self.scalar_type(), 0, bytes_of(self) + bytes_of(src));
  as_cpu(self).copy_(as_cpu(src));
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  Launch launch;
  book(launch, "_copy_from", dst.scalar_type(), 0, bytes_of(self) + bytes_of(dst));
  as_cpu(dst).copy_(as_cpu(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  Launch launch;
  book(launch, "_copy_from_and_resize", self.scalar_type(), 0, 2 * bytes_of(self));
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
  at::Tensor out = shaped(a, {a.size(0), b.size(1)});
  book_product(launch, "mm", a, b, out);
  return out;
}
at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  Launch launch;
  fit(out, {a.size(0), b.size(1)});
  book_product(launch, "mm", a, b, out);
  return out;
}
at::Tensor addmm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                 const c10::Scalar&, const c10::Scalar&) {
  Launch launch;
  at::Tensor out = shaped(a, {a.size(0), b.size(1)});
  book_product(launch, "addmm", a, b, out, c);
  return out;
}
at::Tensor& addmm_out(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                      const c10::Scalar&, const c10::Scalar&, at::Tensor& out) {
  Launch launch;
  fit(out, {a.size(0), b.size(1)});
  book_product(launch, "addmm", a, b, out, c);
  return out;
}
at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  Launch launch;
  at::Tensor out = shaped(a, {a.size(0), a.size(1), b.size(2)});
  book_product(launch, "bmm", a, b, out);
  return out;
}
at::Tensor& bmm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  Launch launch;
  fit(out, {a.size(0), a.size(1), b.size(2)});
  book_product(launch, "bmm", a, b, out);
  return out;
}
at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor&, const at::Tensor&,
                     const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                     std::optional<c10::ScalarType> out_dtype, bool) {
  Launch launch;
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "_scaled_mm: shapes");
  TORCH_CHECK(a.is_contiguous() && b.t().is_contiguous(),
              "_scaled_mm: the first operand row-major and the second column-major");
  TORCH_CHECK(a.size(1) % 16 == 0 && b.size(1) % 16 == 0, "_scaled_mm: sizes divisible by 16");
  at::Tensor out = shaped(a, {a.size(0), b.size(1)}, out_dtype.value_or(c10::kBFloat16));
  book_product(launch, "_scaled_mm", a, b, out);
  return out;
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

// Flash attention, as a GPU's scaled_dot_product_attention runs it where it can (no mask, no
// dropout, bf16 or fp16, head dim ≤ 256): `sdp_choice` picks it, and its forward and backward
// only allocate their outputs, shaped as torch's meta functions shape them (which the compiled
// code is built for), and book the kernel's work: 4·B·H·Tq·Tk·D FLOPs forward (half of that
// causal: the kernel skips the masked tiles), 2.5 times that backward; q, k, v (and the output
// and its gradient, backward) read or written once. Without this the pretend GPU runs SDPA's
// math path, which no GPU takes here: T×T scores written to memory.
int64_t sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& mask, double dropout, bool, std::optional<double>,
                   bool gqa) {
  bool half = q.scalar_type() == c10::kBFloat16 || q.scalar_type() == c10::kHalf;
  bool flash = !mask.has_value() && dropout == 0.0 && !gqa && half && q.dim() == 4 &&
               k.dim() == 4 && v.dim() == 4 && q.size(-1) <= 256 && q.size(-1) == v.size(-1) &&
               q.size(1) == k.size(1);
  return flash ? 1 : 0;  // sdp::SDPBackend: 1 flash_attention, 0 math
}

double attention_flops(const at::Tensor& q, const at::Tensor& k, bool causal) {
  double f = 4.0 * q.size(0) * q.size(1) * q.size(2) * k.size(2) * q.size(3);
  return causal ? f / 2 : f;
}

void flash_forward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  Launch launch;
  auto args = torch::jit::last(*stack, 7);
  at::Tensor q = args[0].toTensor(), k = args[1].toTensor(), v = args[2].toTensor();
  bool causal = args[4].toBool(), debug = args[5].toBool();
  TORCH_CHECK(!debug, "the pretend GPU's flash attention returns no debug mask");
  at::Tensor out = at::empty_like(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(c10::kFloat));
  at::Tensor seed = at::empty({2}, q.options().dtype(c10::kUInt64));
  at::Tensor offset = at::empty({}, q.options().dtype(c10::kUInt64));
  at::Tensor none = at::empty({0}, q.options());
  book(launch, "_scaled_dot_product_flash_attention", q.scalar_type(),
       attention_flops(q, k, causal),
       bytes_of(q) + bytes_of(k) + bytes_of(v) + bytes_of(out) + bytes_of(lse));
  torch::jit::drop(*stack, 7);
  torch::jit::push(*stack, out, lse, at::Tensor(), at::Tensor(), c10::SymInt(q.size(2)),
                   c10::SymInt(k.size(2)), seed, offset, none);
}

void flash_backward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  Launch launch;
  auto args = torch::jit::last(*stack, 15);
  at::Tensor grad = args[0].toTensor(), q = args[1].toTensor(), k = args[2].toTensor(),
             v = args[3].toTensor(), out = args[4].toTensor();
  bool causal = args[11].toBool();
  at::Tensor gq = at::empty_like(q), gk = at::empty_like(k), gv = at::empty_like(v);
  book(launch, "_scaled_dot_product_flash_attention_backward", q.scalar_type(),
       2.5 * attention_flops(q, k, causal),
       bytes_of(grad) + bytes_of(q) + bytes_of(k) + bytes_of(v) + bytes_of(out) + bytes_of(gq) +
           bytes_of(gk) + bytes_of(gv));
  torch::jit::drop(*stack, 15);
  torch::jit::push(*stack, gq, gk, gv);
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Launch launch;
  const auto& schema = op.schema();
  const size_t n_in = schema.arguments().size();
  double bytes = 0;
  c10::ScalarType dtype = c10::kFloat;
  bool typed = false;
  for (size_t i = 0; i < n_in; ++i) {
    const auto& arg = schema.arguments()[i];
    const c10::IValue& v = (*stack)[stack->size() - n_in + i];
    if (v.isTensor() && v.toTensor().defined() && !typed) {
      dtype = v.toTensor().scalar_type();
      typed = true;
    }
    bool out_buffer = arg.kwarg_only() && arg.alias_info() && arg.alias_info()->isWrite();
    if (!out_buffer) bytes += bytes_of(v);  // an out= buffer is only written (counted below)
  }
  at::native::cpu_fallback(op, stack);
  const size_t n_out = schema.returns().size();
  for (size_t i = 0; i < n_out; ++i) bytes += bytes_of((*stack)[stack->size() - n_out + i]);
  std::string name = schema.name();
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  book(launch, name.rfind("aten::", 0) == 0 ? name.substr(6) : name, dtype, 0, bytes);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  Launch launch;
  book(launch, "_local_scalar_dense", self.scalar_type(), 0, bytes_of(self));
  return as_cpu(self).item();
}

}  // namespace

REGISTER_ALLOCATOR(c10::DeviceType::CUDA, &host_as_cuda);

namespace at::native {
REGISTER_CUDA_DISPATCH(_fused_sdp_choice_stub, &sdp_choice)
}  // namespace at::native

// Read by scripts/gpu_dryrun/launches.py through ctypes.
extern "C" int64_t host_cuda_launches() { return launches.load(); }
// The ledger, through ctypes: switched on or off; its lines so far, taken (and cleared) into
// `buf` when `cap` holds them, else left; the size they need either way.
extern "C" void host_cuda_ledger_keep(int on) { keeping.store(on != 0); }
extern "C" int64_t host_cuda_ledger_take(char* buf, int64_t cap) {
  std::lock_guard<std::mutex> lock(ledger_mutex);
  const auto need = static_cast<int64_t>(ledger.size());
  if (buf != nullptr && cap >= need) {
    std::memcpy(buf, ledger.data(), ledger.size());
    ledger.clear();
  }
  return need;
}

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
  m.impl("_scaled_dot_product_flash_attention",
         torch::CppFunction::makeFromBoxedFunction<&flash_forward>());
  m.impl("_scaled_dot_product_flash_attention_backward",
         torch::CppFunction::makeFromBoxedFunction<&flash_backward>());
  // Views share the host memory: the device-independent implementations.
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
}

TORCH_LIBRARY_IMPL(_, CUDA, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}
