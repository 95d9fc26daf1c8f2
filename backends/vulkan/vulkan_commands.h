// Recording and submission. Ops are recorded into one command buffer and submitted together at
// a sync point (download / synchronize): one submit per forward step.
//
// Barriers: the stream remembers which buffer ranges the commands since the last barrier read
// and wrote. A new command that reads or writes a range written since then (read-after-write,
// write-after-write), or writes a range read since then (write-after-read), gets one global
// memory barrier first; independent commands run without one.
//
// Bindings: a tensor view is bound as a storage-buffer descriptor whose offset is rounded down
// to minStorageBufferOffsetAlignment; the view's first element within the binding is passed to
// the shader as a uint push constant, one per binding, ahead of the op's own push constants.
// A view larger than maxStorageBufferRange cannot be bound and is reported as an error.
//
// Timing (Backend::begin_profile): while on, every command of a submit is followed by a
// timestamp written when it and everything before it have finished, behind one at the
// submit's start; after the submit, each command is charged the time from the timestamp
// before it to its own. Commands inside a recording are not timed (the backend does not
// record while timing).
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/vulkan/vulkan_context.h"
#include "backends/vulkan/vulkan_memory.h"
#include "backends/vulkan/vulkan_pipelines.h"

namespace tmx::vk {

struct BufferRange {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceSize offset = 0, size = 0;  // bytes
};

struct Binding {
    BufferRange range;
    bool write = false;
    bool tracked = true;  // false for the status word, which shaders only touch atomically
};

// A recorded step (Backend::run_recorded): a secondary command buffer and the descriptor sets
// it binds, which Stream::execute() runs inside later submits without recording it again.
class Recording {
  public:
    explicit Recording(std::shared_ptr<Context> ctx);
    ~Recording();
    Recording(const Recording&) = delete;
    Recording& operator=(const Recording&) = delete;

  private:
    friend class Stream;
    std::shared_ptr<Context> ctx_;
    VkCommandPool pool_ = VK_NULL_HANDLE;
    VkCommandBuffer cmd_ = VK_NULL_HANDLE;
    std::vector<VkDescriptorPool> descriptor_pools_;
    size_t descriptor_pool_ = 0;
};

class Stream {
  public:
    Stream(std::shared_ptr<Context> ctx, std::shared_ptr<Allocator> allocator);
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;

    void dispatch(const Pipeline& p, std::span<const Binding> bindings, const void* push,
                  size_t push_bytes, uint32_t gx, uint32_t gy = 1, uint32_t gz = 1);
    void fill(const BufferRange& dst, uint32_t word);
    void copy(const BufferRange& src, const BufferRange& dst);  // ranges must not overlap
    // The host data is copied to staging memory before this returns.
    void upload(const BufferRange& dst, const void* host);
    // Submits everything recorded, waits, and copies the range to the host.
    void download(const BufferRange& src, void* host);
    // Submits what is recorded (if anything) and waits for it.
    void submit_and_wait();

    // Commands from begin_recording() to end_recording() go into `rec` instead of the next
    // submit; nothing may be submitted (no upload, download or sync) in between.
    void begin_recording(Recording& rec);
    void end_recording();
    // Runs a finished recording after the commands recorded so far, with a barrier on each
    // side (its first commands read what came before, what comes after reads its results).
    void execute(const Recording& rec);

    // The 4-word status buffer shaders report bad inputs in (see shaders/common.glsl).
    Binding status_binding() const;
    // The status words, reset to zero for the next submit. Call after submit_and_wait().
    std::array<uint32_t, 4> take_status();

    // Called with every range a command recorded from now on writes (dispatch outputs, fill,
    // copy and upload destinations): how the fp16 weight copies learn their source changed.
    void on_write(std::function<void(const BufferRange&)> observer) {
        write_observer_ = std::move(observer);
    }

    struct Counters {
        uint64_t submits = 0, dispatches = 0, barriers = 0, transfers = 0;
    };
    const Counters& counters() const { return counters_; }

    // Timing (see the top of the file). can_time(): the queue writes timestamps.
    // start_timing() submits what is recorded first; stop_timing() submits and waits for what
    // is recorded, and returns the commands timed since start_timing(), per shader (or
    // "fill", "copy", "recorded step"), in the order each first ran.
    struct TimedCommands {
        std::string name;
        uint64_t count = 0;
        double seconds = 0;
    };
    bool can_time() const { return timestamp_mask_ != 0; }
    void start_timing();
    std::vector<TimedCommands> stop_timing();
    bool timing() const { return timing_; }
    // The pipeline barriers recorded among the commands timed since start_timing() (each a
    // wait of the commands after it for those before; Counters::barriers counts them all).
    uint64_t timed_barriers() const { return timed_barriers_; }

  private:
    VkCommandBuffer cmd();  // begins recording on first use after a submit (or `into_`'s)
    void access(std::span<const Binding> bindings);
    VkDescriptorSet descriptor_set(VkDescriptorSetLayout layout);
    void barrier();
    // While timing, outside a recording: a timestamp after the command just recorded.
    void timestamp(const std::string& name);
    // While timing: charges each command of the submit that just ended its time.
    void collect_timestamps();
    // Host-visible staging memory for one transfer, or false when this submit's staging is
    // used up (the caller submits and retries).
    bool staging(VkDeviceSize bytes, BufferRange* range, std::byte** host);

    std::shared_ptr<Context> ctx_;
    std::shared_ptr<Allocator> allocator_;
    VkCommandPool pool_ = VK_NULL_HANDLE;
    VkCommandBuffer cmd_ = VK_NULL_HANDLE;
    VkFence fence_ = VK_NULL_HANDLE;
    bool recording_ = false;

    std::vector<VkDescriptorPool> descriptor_pools_;
    size_t descriptor_pool_ = 0;  // the pool sets come from now

    struct Range {
        VkBuffer buffer;
        VkDeviceSize begin, end;
    };
    std::vector<Range> written_, read_;              // since the last barrier
    Recording* into_ = nullptr;                      // the recording commands go to, if any
    std::vector<Range> outer_written_, outer_read_;  // the submit's, while recording
    bool barrier_next_ = false;  // after execute(): the next command waits for it

    std::vector<Allocation> staging_chunks_;
    size_t staging_chunk_ = 0;
    VkDeviceSize staging_used_ = 0;

    Allocation status_;
    Counters counters_;

    uint64_t timestamp_mask_ = 0;  // the valid bits of a timestamp; 0: none
    double timestamp_ns_ = 0;      // nanoseconds per timestamp tick
    VkQueryPool timestamps_ = VK_NULL_HANDLE;
    bool timing_ = false;
    uint64_t timed_barriers_ = 0;
    uint32_t timestamps_used_ = 0;           // in this submit, the start's included
    std::vector<size_t> timestamp_command_;  // per timestamp after the start: its command
    std::vector<TimedCommands> timed_;
    std::function<void(const BufferRange&)> write_observer_;
};

}  // namespace tmx::vk
