// Vulkan backend: setup, memory and transfers, status checks, elementwise ops, and the
// training ops it does not have. The other ops live beside it, one file per op family as in
// backends/cpu/.
#include "backends/vulkan/vulkan_backend.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "backends/vulkan/vulkan_activations.h"
#include "engine/core/errors.h"

namespace tmx {
namespace {

// Error codes of shaders/common.glsl.
std::string status_message(const std::array<uint32_t, 4>& s) {
    const std::string value = std::to_string(static_cast<int32_t>(s[1]));
    const std::string limit = std::to_string(s[2]);
    switch (s[0]) {
        case 2:
            return "gather_rows: row " + value + " outside [0, " + limit + ")";
        case 3:
            return "moe: expert index " + value + " outside [0, " + limit + ")";
        case 4:
            return "cross_entropy: target " + value + " outside the vocabulary of " + limit;
        case 5:
            return "moe_combine: slot " + value + " outside [0, " + limit + ")";
        default:
            return "a Vulkan shader reported error code " + std::to_string(s[0]);
    }
}

}  // namespace

std::unique_ptr<Backend> make_vulkan_backend(const vk::VulkanOptions& options) {
    return std::make_unique<VulkanBackend>(options);
}

namespace {

// The device's pipeline cache file, or "" where there is no cache directory.
std::string pipeline_cache_file(const vk::DeviceInfo& d) {
    try {
        return vk::pipeline_cache_path(d);
    } catch (const Error&) {
        return "";
    }
}

}  // namespace

VulkanBackend::VulkanBackend(const vk::VulkanOptions& options)
    : ctx_(std::make_shared<vk::Context>(options)),
      allocator_(std::make_shared<vk::Allocator>(ctx_)),
      fp16_(ctx_->fp16_weights() ? std::make_shared<vk::Fp16Weights>(allocator_) : nullptr),
      pipelines_(std::make_unique<vk::Pipelines>(ctx_, pipeline_cache_file(ctx_->info()))),
      stream_(std::make_unique<vk::Stream>(ctx_, allocator_)),
      table_(ctx_->info()) {
    if (fp16_) stream_->on_write([c = fp16_.get()](const vk::BufferRange& r) { c->invalidate(r); });
    // Every device has 128 invocations and 16 KiB of shared memory per workgroup; most have
    // more, which the defaults assume.
    const vk::DeviceInfo& d = ctx_->info();
    if (d.max_workgroup_invocations < 256) tuning_.elementwise_wg = tuning_.group_wg = 128;
    load_tuning(options);
    if (const char* force = std::getenv("TMX_VULKAN_FORCE_VARIANT"); force && *force)
        table_.force_from_list(force);
    dummy_ = alloc({4});
}

VulkanBackend::~VulkanBackend() = default;

// ---- bindings and dispatch

vk::BufferRange VulkanBackend::range(const Tensor& t) const {
    auto* buf = dynamic_cast<vk::VulkanBuffer*>(t.buffer());
    if (!buf) throw std::logic_error("Vulkan backend: a tensor of another backend was passed");
    const vk::Allocation& a = buf->allocation();
    return {a.buffer, a.offset + static_cast<VkDeviceSize>(dtype_bytes(t.dtype(), t.offset())),
            t.bytes()};
}

vk::Binding VulkanBackend::in(const Tensor& t) const {
    if (!t.defined() || t.numel() == 0) return {range(dummy_), false};
    return {range(t), false};
}

vk::Binding VulkanBackend::out(const Tensor& t) const {
    if (!t.defined() || t.numel() == 0) return {range(dummy_), true};
    return {range(t), true};
}

vk::Binding VulkanBackend::inout(const Tensor& t) const {
    return out(t);
}

std::pair<uint32_t, uint32_t> VulkanBackend::grid(uint64_t n, uint32_t wg) const {
    const uint64_t groups = (n + wg - 1) / wg;
    const uint64_t max_x = ctx_->limits().maxComputeWorkGroupCount[0];
    if (groups <= max_x) return {static_cast<uint32_t>(groups), 1};
    return {static_cast<uint32_t>(max_x), static_cast<uint32_t>((groups + max_x - 1) / max_x)};
}

// ---- memory, transfers, sync

std::shared_ptr<DeviceBuffer> VulkanBackend::alloc_impl(size_t bytes) {
    vk::VulkanBuffer::ReleaseHook drop_copies;
    if (fp16_)
        drop_copies = [w = std::weak_ptr<vk::Fp16Weights>(fp16_)](const vk::Allocation& a) {
            if (auto c = w.lock()) c->invalidate({a.buffer, a.offset, a.size});
        };
    auto buffer = std::make_shared<vk::VulkanBuffer>(allocator_, bytes, vk::MemoryKind::Device,
                                                     std::move(drop_copies));
    if (pinned_) pinned_->push_back(buffer);
    return buffer;
}

namespace {

// A recorded step: the command buffer, the buffers it allocated for itself, and the fp16
// weight copies' drop count when it was recorded. The destructor first lets the device finish
// a submit that may run it.
struct VulkanStep {
    std::vector<std::shared_ptr<DeviceBuffer>> pinned;
    std::function<void()> finish_pending;
    std::unique_ptr<vk::Recording> recording;
    uint64_t fp16_drops = 0;
    ~VulkanStep() {
        try {
            if (finish_pending) finish_pending();
        } catch (...) {  // a destructor must not throw; the device may be lost
        }
        recording.reset();
    }
};

}  // namespace

void VulkanBackend::begin_profile() {
    stream_->start_timing();
}

std::vector<Backend::ProfiledCommands> VulkanBackend::end_profile() {
    if (!stream_->timing()) throw std::logic_error("end_profile() without begin_profile()");
    std::vector<ProfiledCommands> out;
    for (vk::Stream::TimedCommands& t : stream_->stop_timing())
        out.push_back({std::move(t.name), static_cast<int64_t>(t.count), t.seconds});
    profiled_barriers_ = static_cast<int64_t>(stream_->timed_barriers());
    check_status();
    return out;
}

void VulkanBackend::run_recorded(StepRecording& rec, const std::function<void()>& body) {
    if (stream_->timing()) {
        // Each command timed as body issues it. A replay would not be, and body may not run
        // beside a recording of itself (it may allocate anew): drop it, record afresh later.
        rec.graph.reset();
        ++rec.runs;
        body();
        return;
    }
    const uint64_t drops = fp16_ ? fp16_->drops() : 0;
    if (rec.graph) {
        const auto* step = static_cast<const VulkanStep*>(rec.graph.get());
        if (step->fp16_drops == drops) {
            stream_->execute(*step->recording);
            return;
        }
        // An fp16 weight copy the recording may read was dropped: record afresh.
        rec.graph.reset();
        rec.runs = 1;
    }
    if (rec.runs++ == 0) {
        body();
        return;
    }
    auto step = std::make_shared<VulkanStep>();
    step->recording = std::make_unique<vk::Recording>(ctx_);
    step->finish_pending = [this, alive = std::weak_ptr<bool>(alive_)] {
        if (const auto a = alive.lock(); a && *a) stream_->submit_and_wait();
    };
    stream_->begin_recording(*step->recording);
    pinned_ = &step->pinned;
    try {
        body();
    } catch (...) {
        pinned_ = nullptr;
        stream_->end_recording();
        step->finish_pending = nullptr;
        throw;
    }
    pinned_ = nullptr;
    stream_->end_recording();
    step->fp16_drops = fp16_ ? fp16_->drops() : 0;
    rec.graph = step;
    stream_->execute(*step->recording);
}

void VulkanBackend::upload_impl(const Tensor& dst, const void* host) {
    stream_->upload(range(dst), host);
}

void VulkanBackend::download_impl(const Tensor& src, void* host) {
    stream_->download(range(src), host);
    check_status();
}

uint64_t VulkanBackend::memory_capacity() const {
    // The largest device-local heap: where the allocator places tensors (vulkan_memory.h).
    const VkPhysicalDeviceMemoryProperties& m = ctx_->memory_properties();
    uint64_t largest = 0;
    for (uint32_t h = 0; h < m.memoryHeapCount; ++h)
        if (m.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
            largest = std::max<uint64_t>(largest, m.memoryHeaps[h].size);
    return largest;
}

std::string VulkanBackend::description() const {
    const vk::DeviceInfo& d = ctx_->info();
    return "vulkan: " + d.name + " (device " + std::to_string(d.index) + "), " +
           "f32 weights read as " + (fp16_weights() ? "fp16" : "fp32") + ", " +
           (table_.tuned_shapes() > 0 ? "tuned" : "untuned");
}

void VulkanBackend::synchronize() {
    stream_->submit_and_wait();
    check_status();
}

void VulkanBackend::check_status() {
    const auto s = stream_->take_status();
    if (s[0] != 0) throw Error(status_message(s));
}

void VulkanBackend::fill_impl(const Tensor& dst, float value) {
    const uint32_t word = dst.dtype() == DType::I32
                              ? static_cast<uint32_t>(static_cast<int32_t>(value))
                              : std::bit_cast<uint32_t>(value);
    stream_->fill(range(dst), word);
}

void VulkanBackend::copy_impl(const Tensor& src, const Tensor& dst) {
    const vk::BufferRange s = range(src), d = range(dst);
    if (s.buffer == d.buffer && s.offset < d.offset + d.size && d.offset < s.offset + s.size) {
        if (s.offset == d.offset) return;
        // vkCmdCopyBuffer forbids overlapping regions: go through a scratch tensor.
        Tensor scratch = alloc(src.shape(), src.dtype());
        stream_->copy(s, range(scratch));
        stream_->copy(range(scratch), d);
        return;
    }
    stream_->copy(s, d);
}

// ---- gathers and elementwise ops

// gather_rows.comp, with x read in its format (an embedding table's may be 16 or 8 bits).
void VulkanBackend::gather_rows_impl(const Tensor& x, const Tensor& rows, const Tensor& out_t) {
    const uint32_t S = static_cast<uint32_t>(rows.dim(0)), d = static_cast<uint32_t>(x.dim(1));
    std::string shader = "gather_rows";
    const WeightBinding x_read = stored_weight(x, shader);
    struct {
        uint32_t S, d, n_rows, x_adjust;
    } push{S, d, static_cast<uint32_t>(x.dim(0)), x_read.byte_adjust};
    auto [gx, gy] = grid(uint64_t{S} * d, tuning_.elementwise_wg);
    run(shader, {tuning_.elementwise_wg},
        {x_read.binding, in(rows), out(out_t), stream_->status_binding()}, push, gx, gy);
}

// gather_rows_backward.comp: one invocation per (column, range of d_x's rows), each walking the
// slots in order. About 256 slots a range on average (a range's invocations walk every slot
// but add only their own rows'), at most 65,535 ranges (a dispatch's y) and never more than
// rows.
void VulkanBackend::gather_rows_backward_impl(const Tensor& rows, const Tensor& d_out,
                                              const Tensor& d_x) {
    const uint32_t S = static_cast<uint32_t>(rows.dim(0)), d = static_cast<uint32_t>(d_x.dim(1));
    const auto n_rows = static_cast<uint32_t>(d_x.dim(0));
    if (S == 0 || d == 0) return;
    const uint32_t max_ranges = std::max(1u, std::min(n_rows, 65535u));
    const uint32_t ranges = std::clamp((S + 255) / 256, 1u, max_ranges);
    struct {
        uint32_t S, d, n_rows, range_rows;
    } push{S, d, n_rows, std::max(1u, (n_rows + ranges - 1) / ranges)};
    run("gather_rows_backward", {tuning_.column_wg},
        {in(rows), in(d_out), inout(d_x), stream_->status_binding()}, push,
        (d + tuning_.column_wg - 1) / tuning_.column_wg, ranges);
}

void VulkanBackend::run_elementwise(const std::string& shader, uint32_t op, uint64_t n,
                                    std::initializer_list<vk::Binding> bindings) {
    if (n == 0) return;
    struct {
        uint32_t n;
    } push{static_cast<uint32_t>(n)};
    auto [gx, gy] = grid(n, tuning_.elementwise_wg);
    run(shader, {tuning_.elementwise_wg, op}, bindings, push, gx, gy);
}

void VulkanBackend::elementwise(uint32_t op, const Tensor& x, const Tensor& y, const Tensor& o) {
    run_elementwise("elementwise", op, static_cast<uint64_t>(x.numel()), {in(x), in(y), out(o)});
}

void VulkanBackend::activation_impl(Activation act, const Tensor& x, const Tensor& out_t) {
    elementwise(activation_ops(act).forward, x, x, out_t);
}

void VulkanBackend::activation_backward_impl(Activation act, const Tensor& x, const Tensor& d_out,
                                             const Tensor& d_x) {
    record_activation_backward(activation_ops(act).backward, x, Tensor{}, d_out, d_x, Tensor{});
}

void VulkanBackend::swiglu_impl(const Tensor& gate, const Tensor& up, const Tensor& out_t) {
    elementwise(kSwiglu, gate, up, out_t);
}

void VulkanBackend::swiglu_backward_impl(const Tensor& gate, const Tensor& up, const Tensor& d_out,
                                         const Tensor& d_gate, const Tensor& d_up) {
    record_activation_backward(kSwigluBackward, gate, up, d_out, d_gate, d_up);
}

void VulkanBackend::record_activation_backward(uint32_t op, const Tensor& x, const Tensor& y,
                                               const Tensor& d_out, const Tensor& d_x,
                                               const Tensor& d_y) {
    run_elementwise("activation_backward", op, static_cast<uint64_t>(x.numel()),
                    {in(x), in(y), in(d_out), inout(d_x), inout(d_y)});
}

void VulkanBackend::add_impl(const Tensor& a, const Tensor& b, const Tensor& out_t) {
    elementwise(kAdd, a, b, out_t);
}

}  // namespace tmx
