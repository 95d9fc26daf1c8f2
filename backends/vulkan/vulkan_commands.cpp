// Command recording, hazard tracking, staging transfers and submission.
#include "backends/vulkan/vulkan_commands.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/core/errors.h"

namespace tmx::vk {
namespace {

constexpr uint32_t kSetsPerPool = 512;
// The most storage buffers a shader binds: grouped_matmul_gemv.comp's, with its fused SwiGLU
// (x, w1, b1, offsets, pre, w3, b3, up, out). Devices allow more per stage (lavapipe 32,
// desktop GPUs' drivers far more).
constexpr uint32_t kMaxBindings = 9;
// Staging per submit: chunks of 16 MiB, at most 4; larger transfers go in pieces.
constexpr VkDeviceSize kStagingChunk = 16ull << 20;
constexpr size_t kMaxStagingChunks = 4;
// Timestamps per submit while timing; a submit with more commands is cut in two.
constexpr uint32_t kTimestampsPerSubmit = 8192;

constexpr VkPipelineStageFlags kDeviceStages =
    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;

// A command pool of the context's queue family (`pool_flags`) and one command buffer of `level`
// from it.
void create_command_buffer(const Context& ctx, VkCommandPoolCreateFlags pool_flags,
                           VkCommandBufferLevel level, VkCommandPool* pool, VkCommandBuffer* cmd) {
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.flags = pool_flags;
    pi.queueFamilyIndex = ctx.queue_family();
    check(vkCreateCommandPool(ctx.device(), &pi, nullptr, pool), "vkCreateCommandPool");
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = *pool;
    ai.level = level;
    ai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(ctx.device(), &ai, cmd), "vkAllocateCommandBuffers");
}

}  // namespace

Stream::Stream(std::shared_ptr<Context> ctx, std::shared_ptr<Allocator> allocator)
    : ctx_(std::move(ctx)), allocator_(std::move(allocator)) {
    create_command_buffer(*ctx_, VK_COMMAND_POOL_CREATE_TRANSIENT_BIT,
                          VK_COMMAND_BUFFER_LEVEL_PRIMARY, &pool_, &cmd_);
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    check(vkCreateFence(ctx_->device(), &fi, nullptr, &fence_), "vkCreateFence");
    status_ = allocator_->allocate(4 * sizeof(uint32_t), MemoryKind::Host);
    std::memset(status_.mapped, 0, 4 * sizeof(uint32_t));
    uint32_t families = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(ctx_->physical_device(), &families, nullptr);
    std::vector<VkQueueFamilyProperties> props(families);
    vkGetPhysicalDeviceQueueFamilyProperties(ctx_->physical_device(), &families, props.data());
    const uint32_t bits = props.at(ctx_->queue_family()).timestampValidBits;
    timestamp_mask_ = bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
    timestamp_ns_ = ctx_->limits().timestampPeriod;
}

Stream::~Stream() {
    VkDevice dev = ctx_->device();
    if (recording_) vkEndCommandBuffer(cmd_);  // recorded work that was never asked for
    vkQueueWaitIdle(ctx_->queue());
    for (VkDescriptorPool p : descriptor_pools_) vkDestroyDescriptorPool(dev, p, nullptr);
    if (timestamps_) vkDestroyQueryPool(dev, timestamps_, nullptr);
    vkDestroyFence(dev, fence_, nullptr);
    vkDestroyCommandPool(dev, pool_, nullptr);
    for (const Allocation& a : staging_chunks_) allocator_->release(a);
    allocator_->release(status_);
    allocator_->collect();
}

Recording::Recording(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {
    create_command_buffer(*ctx_, 0, VK_COMMAND_BUFFER_LEVEL_SECONDARY, &pool_, &cmd_);
}

Recording::~Recording() {
    VkDevice dev = ctx_->device();
    for (VkDescriptorPool p : descriptor_pools_) vkDestroyDescriptorPool(dev, p, nullptr);
    vkDestroyCommandPool(dev, pool_, nullptr);
}

void Stream::begin_recording(Recording& rec) {
    if (into_) throw std::logic_error("Vulkan: a step is already being recorded");
    VkCommandBufferInheritanceInfo inherit{VK_STRUCTURE_TYPE_COMMAND_BUFFER_INHERITANCE_INFO};
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    // Simultaneous use: one submit may run it more than once (steps without a sync between).
    bi.flags = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT;
    bi.pInheritanceInfo = &inherit;
    check(vkBeginCommandBuffer(rec.cmd_, &bi), "vkBeginCommandBuffer");
    into_ = &rec;
    // The recording tracks its own hazards; execute() orders it against the submit's commands.
    outer_written_.swap(written_);
    outer_read_.swap(read_);
    written_.clear();
    read_.clear();
}

void Stream::end_recording() {
    if (!into_) return;
    const VkResult r = vkEndCommandBuffer(into_->cmd_);
    into_ = nullptr;
    written_.swap(outer_written_);
    read_.swap(outer_read_);
    check(r, "vkEndCommandBuffer");
}

void Stream::execute(const Recording& rec) {
    if (into_) throw std::logic_error("Vulkan: a recording cannot run inside another");
    barrier();
    vkCmdExecuteCommands(cmd(), 1, &rec.cmd_);
    barrier_next_ = true;
    timestamp("recorded step");
}

void Stream::barrier() {
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                       VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    vkCmdPipelineBarrier(cmd(), kDeviceStages, kDeviceStages, 0, 1, &mb, 0, nullptr, 0, nullptr);
    written_.clear();
    read_.clear();
    barrier_next_ = false;
    ++counters_.barriers;
    if (timing_ && !into_) ++timed_barriers_;
}

VkCommandBuffer Stream::cmd() {
    if (into_) return into_->cmd_;
    if (!recording_) {
        VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        check(vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer");
        recording_ = true;
        if (timing_) {
            vkCmdResetQueryPool(cmd_, timestamps_, 0, kTimestampsPerSubmit);
            vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, timestamps_, 0);
            timestamps_used_ = 1;
        }
    }
    return cmd_;
}

void Stream::access(std::span<const Binding> bindings) {
    auto overlaps = [](const std::vector<Range>& set, const Range& r) {
        for (const Range& s : set)
            if (s.buffer == r.buffer && s.begin < r.end && r.begin < s.end) return true;
        return false;
    };
    bool hazard = false;
    for (const Binding& b : bindings) {
        if (!b.tracked) continue;
        const Range r{b.range.buffer, b.range.offset, b.range.offset + b.range.size};
        hazard = hazard || overlaps(written_, r) || (b.write && overlaps(read_, r));
    }
    if (hazard || barrier_next_) barrier();
    for (const Binding& b : bindings) {
        if (!b.tracked) continue;
        const Range r{b.range.buffer, b.range.offset, b.range.offset + b.range.size};
        (b.write ? written_ : read_).push_back(r);
        if (b.write && write_observer_) write_observer_(b.range);
    }
}

VkDescriptorSet Stream::descriptor_set(VkDescriptorSetLayout layout) {
    // A recording's sets live as long as it does; the submit's are reset after it.
    std::vector<VkDescriptorPool>& pools = into_ ? into_->descriptor_pools_ : descriptor_pools_;
    size_t& current = into_ ? into_->descriptor_pool_ : descriptor_pool_;
    for (;; ++current) {
        if (current == pools.size()) {
            VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                      kSetsPerPool * kMaxBindings};
            VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
            pi.maxSets = kSetsPerPool;
            pi.poolSizeCount = 1;
            pi.pPoolSizes = &size;
            VkDescriptorPool p = VK_NULL_HANDLE;
            check(vkCreateDescriptorPool(ctx_->device(), &pi, nullptr, &p),
                  "vkCreateDescriptorPool");
            pools.push_back(p);
        }
        VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
        ai.descriptorPool = pools[current];
        ai.descriptorSetCount = 1;
        ai.pSetLayouts = &layout;
        VkDescriptorSet set = VK_NULL_HANDLE;
        VkResult r = vkAllocateDescriptorSets(ctx_->device(), &ai, &set);
        if (r == VK_SUCCESS) return set;
        if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL)
            fail(r, "vkAllocateDescriptorSets");
    }
}

void Stream::dispatch(const Pipeline& p, std::span<const Binding> bindings, const void* push,
                      size_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
    if (bindings.size() != p.bindings || bindings.size() > kMaxBindings)
        throw std::logic_error("Vulkan dispatch: binding count differs from the pipeline's");
    if (gx == 0 || gy == 0 || gz == 0) return;
    const auto& lim = ctx_->limits();
    if (gx > lim.maxComputeWorkGroupCount[0] || gy > lim.maxComputeWorkGroupCount[1] ||
        gz > lim.maxComputeWorkGroupCount[2])
        throw Error("Vulkan: a dispatch of " + std::to_string(gx) + "x" + std::to_string(gy) + "x" +
                    std::to_string(gz) + " workgroups exceeds the device's limits");
    const VkDeviceSize align = std::max<VkDeviceSize>(lim.minStorageBufferOffsetAlignment, 4);

    VkDescriptorBufferInfo infos[kMaxBindings];
    VkWriteDescriptorSet writes[kMaxBindings];
    uint32_t data[Pipelines::kPushBytes / 4] = {};
    const size_t n = bindings.size();
    if (n * 4 + push_bytes > Pipelines::kPushBytes)
        throw std::logic_error("Vulkan dispatch: push constants exceed 128 bytes");
    VkDescriptorSet set = descriptor_set(p.set_layout);
    for (size_t i = 0; i < n; ++i) {
        const BufferRange& r = bindings[i].range;
        const VkDeviceSize base = r.offset / align * align;
        // Whole 4-byte words: a 16- or 8-bit tensor may end mid-word, and shaders read words
        // (allocations are whole words, so the rounded range stays inside its buffer).
        const VkDeviceSize range =
            std::max<VkDeviceSize>((r.offset + r.size - base + 3) / 4 * 4, 4);
        if (range > lim.maxStorageBufferRange)
            throw Error("Vulkan: a tensor view of " + std::to_string(r.size >> 20) +
                        " MiB exceeds the device's maxStorageBufferRange (" +
                        std::to_string(lim.maxStorageBufferRange >> 20) + " MiB)");
        infos[i] = {r.buffer, base, range};
        data[i] = static_cast<uint32_t>((r.offset - base) / 4);
        writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
        writes[i].dstSet = set;
        writes[i].dstBinding = static_cast<uint32_t>(i);
        writes[i].descriptorCount = 1;
        writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        writes[i].pBufferInfo = &infos[i];
    }
    vkUpdateDescriptorSets(ctx_->device(), static_cast<uint32_t>(n), writes, 0, nullptr);
    if (push_bytes) std::memcpy(data + n, push, push_bytes);

    access(bindings);
    VkCommandBuffer c = cmd();
    vkCmdBindPipeline(c, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
    vkCmdBindDescriptorSets(c, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, &set, 0, nullptr);
    // The whole declared range, so every push-constant byte a shader may read is defined.
    vkCmdPushConstants(c, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, Pipelines::kPushBytes, data);
    vkCmdDispatch(c, gx, gy, gz);
    ++counters_.dispatches;
    timestamp(p.shader);
}

void Stream::fill(const BufferRange& dst, uint32_t word) {
    if (dst.size == 0) return;
    const Binding b{dst, true};
    access({&b, 1});
    vkCmdFillBuffer(cmd(), dst.buffer, dst.offset, dst.size, word);
    ++counters_.transfers;
    timestamp("fill");
}

void Stream::copy(const BufferRange& src, const BufferRange& dst) {
    if (src.size == 0) return;
    const Binding b[2] = {{src, false}, {dst, true}};
    access(b);
    VkBufferCopy region{src.offset, dst.offset, src.size};
    vkCmdCopyBuffer(cmd(), src.buffer, dst.buffer, 1, &region);
    ++counters_.transfers;
    timestamp("copy");
}

bool Stream::staging(VkDeviceSize bytes, BufferRange* range, std::byte** host) {
    bytes = (bytes + 15) / 16 * 16;
    while (staging_chunk_ < kMaxStagingChunks) {
        if (staging_chunk_ == staging_chunks_.size())
            staging_chunks_.push_back(allocator_->allocate(kStagingChunk, MemoryKind::Host));
        const Allocation& a = staging_chunks_[staging_chunk_];
        if (staging_used_ + bytes <= a.size) {
            *range = {a.buffer, a.offset + staging_used_, bytes};
            *host = a.mapped + staging_used_;
            staging_used_ += bytes;
            return true;
        }
        ++staging_chunk_;
        staging_used_ = 0;
    }
    return false;
}

void Stream::upload(const BufferRange& dst, const void* host) {
    const auto* src = static_cast<const std::byte*>(host);
    for (VkDeviceSize done = 0; done < dst.size;) {
        const VkDeviceSize piece = std::min(dst.size - done, kStagingChunk);
        BufferRange stage;
        std::byte* mapped = nullptr;
        if (!staging(piece, &stage, &mapped)) {
            submit_and_wait();
            continue;
        }
        std::memcpy(mapped, src + done, piece);
        stage.size = piece;
        copy(stage, {dst.buffer, dst.offset + done, piece});
        done += piece;
    }
}

void Stream::download(const BufferRange& src, void* host) {
    auto* out = static_cast<std::byte*>(host);
    for (VkDeviceSize done = 0; done < src.size;) {
        const VkDeviceSize piece = std::min(src.size - done, kStagingChunk);
        BufferRange stage;
        std::byte* mapped = nullptr;
        if (!staging(piece, &stage, &mapped)) {
            submit_and_wait();
            continue;
        }
        stage.size = piece;
        copy({src.buffer, src.offset + done, piece}, stage);
        submit_and_wait();  // staging stays mapped and untouched until the next recording
        std::memcpy(out + done, mapped, piece);
        done += piece;
    }
}

void Stream::submit_and_wait() {
    if (into_)
        throw std::logic_error("Vulkan: a recorded step may not submit (upload, download, sync)");
    if (recording_) {
        // Make device writes (downloads' staging copies, the status word) visible to the host.
        VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
        mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
        mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
        vkCmdPipelineBarrier(cmd_, kDeviceStages, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr,
                             0, nullptr);
        check(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
        recording_ = false;
        VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
        si.commandBufferCount = 1;
        si.pCommandBuffers = &cmd_;
        check(vkQueueSubmit(ctx_->queue(), 1, &si, fence_), "vkQueueSubmit");
        ++counters_.submits;
        check(vkWaitForFences(ctx_->device(), 1, &fence_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
        check(vkResetFences(ctx_->device(), 1, &fence_), "vkResetFences");
        check(vkResetCommandPool(ctx_->device(), pool_, 0), "vkResetCommandPool");
        if (timing_) collect_timestamps();
    }
    for (size_t i = 0; i <= descriptor_pool_ && i < descriptor_pools_.size(); ++i)
        check(vkResetDescriptorPool(ctx_->device(), descriptor_pools_[i], 0),
              "vkResetDescriptorPool");
    descriptor_pool_ = 0;
    written_.clear();
    read_.clear();
    barrier_next_ = false;  // everything before has finished
    staging_chunk_ = 0;
    staging_used_ = 0;
    allocator_->collect();
}

void Stream::start_timing() {
    if (!can_time())
        throw Error("Vulkan: " + ctx_->info().name +
                    "'s compute queue writes no timestamps, so its commands cannot be timed");
    if (into_) throw std::logic_error("Vulkan: timing cannot start inside a recording");
    submit_and_wait();  // what came before is not timed
    if (!timestamps_) {
        VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
        qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
        qi.queryCount = kTimestampsPerSubmit;
        check(vkCreateQueryPool(ctx_->device(), &qi, nullptr, &timestamps_), "vkCreateQueryPool");
    }
    timed_.clear();
    timed_barriers_ = 0;
    timing_ = true;
}

std::vector<Stream::TimedCommands> Stream::stop_timing() {
    submit_and_wait();
    timing_ = false;
    return std::move(timed_);
}

void Stream::timestamp(const std::string& name) {
    if (!timing_ || into_) return;
    size_t i = 0;
    while (i < timed_.size() && timed_[i].name != name) ++i;
    if (i == timed_.size()) timed_.push_back({name});
    ++timed_[i].count;
    vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, timestamps_,
                        timestamps_used_++);
    timestamp_command_.push_back(i);
    if (timestamps_used_ == kTimestampsPerSubmit) submit_and_wait();
}

void Stream::collect_timestamps() {
    const uint32_t n = timestamps_used_;
    timestamps_used_ = 0;
    std::vector<uint64_t> ticks(n);
    if (n > 1)
        check(vkGetQueryPoolResults(ctx_->device(), timestamps_, 0, n, n * sizeof(uint64_t),
                                    ticks.data(), sizeof(uint64_t),
                                    VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
              "vkGetQueryPoolResults");
    // The mask makes a difference across a wrap of the counter's valid bits come out right.
    for (uint32_t q = 1; q < n; ++q)
        timed_[timestamp_command_[q - 1]].seconds +=
            static_cast<double>((ticks[q] - ticks[q - 1]) & timestamp_mask_) * timestamp_ns_ * 1e-9;
    timestamp_command_.clear();
}

Binding Stream::status_binding() const {
    return {{status_.buffer, status_.offset, 4 * sizeof(uint32_t)}, true, false};
}

std::array<uint32_t, 4> Stream::take_status() {
    std::array<uint32_t, 4> s;
    std::memcpy(s.data(), status_.mapped, sizeof(s));
    if (s[0] != 0) std::memset(status_.mapped, 0, sizeof(s));
    return s;
}

}  // namespace tmx::vk
