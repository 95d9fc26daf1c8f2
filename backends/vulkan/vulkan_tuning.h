// The tunable shaders' shapes: which specialization constants (tile, workgroup, register block,
// rows per workgroup) a matmul-family dispatch runs with on this device, at this call's shape.
//
// Each kernel family has a fixed candidate set (candidates()); a device keeps those its limits
// allow (workgroup invocations, workgroup size, shared memory). Without tuning, a call gets the
// built-in default for the device's vendor and the call's size (TuningTable::default_variant).
// `tmx tune` times every candidate at the model's real shapes on the device and writes the
// winners to a tuning file (TuningFile) keyed by the device's identity: vendor and device ids,
// driver version and pipeline-cache UUID, and the shaders it timed (a hash of the embedded
// SPIR-V). The backend loads the file for its device when it starts; a file for another device,
// driver or tmx build, or one that does not parse, is refused with the reason and the defaults
// are used.
//
// A tuned choice applies to the calls with the same kernel, columns, depth and layout whose rows
// fall in the same power-of-two class; other row counts take the tuned choice of the nearest
// class, and other shapes the default.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/vulkan/vulkan_context.h"

namespace tmx::vk {

// The tunable kernel families, named as their shaders.
enum class Kernel : uint8_t {
    Matmul,             // matmul.comp: tiled dense
    MatmulGemv,         // matmul_gemv.comp: dense, few rows (decode)
    GroupedMatmul,      // grouped_matmul.comp: tiled, per expert
    GroupedMatmulGemv,  // grouped_matmul_gemv.comp: per expert, few slots (decode)
    GroupedMatmulDx,    // grouped_matmul_backward_dx.comp
    GroupedMatmulDw,    // grouped_matmul_backward_dw.comp
    AttentionTiled,     // attention_tiled.comp: prefill attention
    AttentionSplit,     // attention_split.comp: decoding's attention, the window in slices
};
inline constexpr int kKernelCount = 8;
const char* kernel_name(Kernel k);
std::optional<Kernel> kernel_from_name(std::string_view name);
// Whether the family is a matrix-vector kernel ({wg, rows, sg}) rather than a tiled one
// ({wg, bm, bn, bk, tm, tn}), prefill attention ({wg, bq, bk, sg}) or decode attention
// ({wg, sl}).
bool is_gemv(Kernel k);
// attention_tiled.comp's longest head (its MAX_HEAD_DIM), which its shared memory is sized for.
inline constexpr uint32_t kAttentionTiledMaxHeadDim = 128;
// The SG of prefill attention's register-blocked form (".rb4", below).
inline constexpr uint32_t kAttentionBlocked = 2;
// The form of the tiled products on cooperative matrices (".cm", matmul_tile_coopmat.glsl).
inline constexpr uint32_t kTiledCoopmat = 1;
// The form of decode attention's short-chain variants (".v4", attention_split_rows.comp).
inline constexpr uint32_t kSplitRows = 1;
// attention_split.comp's bounds: heads per group (MAX_GROUP), and the floats of a group's
// queries (MAX_GROUP_DIM) and of the chunk's keys (MAX_CHUNK_DIM) in its shared memory.
inline constexpr uint32_t kSplitMaxGroup = 16, kSplitGroupDim = 2048, kSplitChunkDim = 1024;

// A kernel's specialization constants, in constant_id order: tiled {WG, BM, BN, BK, TM, TN,
// FORM} (matmul_tile.glsl; FORM is no constant but picks the module: 0 fp32 register blocks, 1
// (kTiledCoopmat, ".cm") cooperative matrices, for matmul and grouped_matmul reading fp16
// weights, on a device with DeviceInfo::coopmat_columns; other calls of such a variant run its
// tile in the fp32 form), matrix-vector {WG, NR, SG} (matmul_gemv.comp), attention {WG, BQ, BK,
// SG} (attention_tiled.comp). The SG of a matrix-vector or attention variant is no constant but
// picks the module, which needs a device with subgroup shuffles when it is 1 (invalid_reason):
// matrix-vector, 0 the workgroup's sum in a shared-memory tree, 1 through subgroup shuffles
// first (the *_sg modules, shaders/gemv_reduce.glsl); attention, 0 the query tile and the
// scores in shared memory, 1 a query's row in the registers of WG / BQ consecutive invocations
// of a subgroup, its scores summed through shuffles (attention_tiled_sg), 2
// (kAttentionBlocked) both products register-blocked, 4 x 4 per invocation, WG = BQ * BK / 16
// (attention_tiled_rb; the host adds the head_dim its tiles are sized for). Decode attention
// {WG, SL, FORM}: SL keys at most per slice of a query's window; FORM 0 (attention_split.comp)
// each key taking ceil(WG / SL) invocations, FORM 1 (kSplitRows, ".v4",
// attention_split_rows.comp) a key per invocation in vec4 reads, trees for the slice's
// statistics, SL a power of two (the host adds head_dim and the group's heads, and takes FORM
// 0 for a head_dim that is no multiple of 4 or over 4 * WG).
struct Variant {
    std::vector<uint32_t> spec;
    // "bm64.bn64.bk16.tm4.tn4" (the workgroup size follows from it; ".cm" after it for FORM
    // 1), "wg64.nr4" (SG 0: the
    // names of tuning files written before SG existed), "wg64.nr4.sg1", "wg64.bq16.bk32" (SG 0
    // likewise), "wg64.bq16.bk32.sg1", "wg128.bq32.bk64.rb4", "wg64.sl64" or "wg64.sl64.v4".
    std::string name(Kernel k) const;
    bool operator==(const Variant&) const = default;
};
// The head_dim a blocked prefill attention variant's tiles are sized for at a call's head_dim hd
// (at most kAttentionTiledMaxHeadDim): 32, 64 or 128, and at least its BK.
uint32_t blocked_attention_head_dim(const Variant& v, int64_t hd);
// The specialization constants a tiled variant's module takes: {WG, BM, BN, BK, TM, TN}, and
// for the cooperative-matrix module (`coop`) the device's subgroup size and
// DeviceInfo::coopmat_columns after them (matmul_tile_coopmat.glsl's SGS and CN).
std::vector<uint32_t> tiled_spec(const Variant& v, const DeviceInfo& d, bool coop);
// The variant as the device runs it: a ".cm" tile on a device without usable cooperative
// matrices (turned off by TMX_VULKAN_COOPMAT=0, or refused by the driver) in its fp32 form, so
// that a tuning file made with them still applies; any other variant as it is.
Variant runnable_form(Kernel k, const Variant& v, const DeviceInfo& d);
// Parses Variant::name(); nullopt when it is not a name of that kernel's form.
std::optional<Variant> parse_variant(Kernel k, std::string_view name);
// Empty when the variant can run on the device, else why not.
std::string invalid_reason(Kernel k, const Variant& v, const DeviceInfo& d);
// The kernel's candidates that the device can run, in a fixed order.
std::vector<Variant> candidates(Kernel k, const DeviceInfo& d);
// Whether an attention variant of SG 1 (which the device can run) has room in the device's
// shared memory for its key and value tiles side by side (attention_tiled.comp's SEPARATE_V: one
// staging step and two barriers per tile fewer) rather than the value tile in the key tile's.
bool attention_separate_values(const Variant& v, const DeviceInfo& d);

// What a choice applies to (see the top of the file). layout: dense, trans_a | trans_b << 1;
// grouped, the number of experts; attention, the query heads (n: head_dim, k: the window; for
// decode attention the keys a query sees, rows its queries).
struct ShapeKey {
    Kernel kernel = Kernel::Matmul;
    uint32_t rows_class = 1;  // rows rounded up to a power of two
    uint32_t n = 0, k = 0, layout = 0;
    auto operator<=>(const ShapeKey&) const = default;
    // "matmul rows<=512 n=512 k=512 b^T" (the transposed operands), "grouped_matmul rows<=64
    // n=2048 k=512 experts=8", "attention_tiled rows<=512 head_dim=64 window=256 heads=8",
    // "attention_split rows<=8 head_dim=64 keys=256 heads=8"
    std::string to_string() const;
};
ShapeKey shape_key(Kernel kernel, int64_t rows, int64_t n, int64_t k, uint32_t layout);

// The identity a tuning file and the pipeline cache are keyed by.
struct DeviceIdentity {
    uint32_t vendor_id = 0, device_id = 0, driver_version = 0;
    std::array<uint8_t, 16> pipeline_cache_uuid{};
    std::string name;  // must match too (check_tuning_applies)
    bool operator==(const DeviceIdentity& o) const {
        return vendor_id == o.vendor_id && device_id == o.device_id &&
               driver_version == o.driver_version && pipeline_cache_uuid == o.pipeline_cache_uuid;
    }
};
DeviceIdentity identity_of(const DeviceInfo& d);
// A hash of every embedded shader's SPIR-V: a tuning file timed other shaders when it differs.
const std::string& shaders_hash();

// One tuned shape: the winner, and what it was measured against.
struct TunedShape {
    ShapeKey key;
    Variant best;
    double best_ms = 0, default_ms = 0;
    int candidates_tried = 0;
};

struct TuningFile {
    DeviceIdentity device;
    std::string shaders;  // shaders_hash() when it was written
    std::vector<TunedShape> shapes;
};
// The file as JSON (format "tmx-vulkan-tuning", version 1).
std::string tuning_file_json(const TuningFile& f);
// Parses a tuning file; throws tmx::Error naming `path` and the field that is wrong.
TuningFile parse_tuning_file(std::string_view text, const std::string& path);
// Throws tmx::Error saying why a parsed file does not apply here: another device, another
// driver (version or pipeline-cache UUID), or other shaders; or a variant this device cannot run.
void check_tuning_applies(const TuningFile& f, const DeviceInfo& here, const std::string& path);

// tmx's cache directory: $XDG_CACHE_HOME/tmx, else $HOME/.cache/tmx. Throws tmx::Error when
// neither variable is set.
std::string cache_dir();
// Where the tuning file and the pipeline cache of a device live in cache_dir().
std::string tuning_file_path(const DeviceInfo& d);
std::string pipeline_cache_path(const DeviceInfo& d);

// Where the backend takes its tuning from (VulkanOptions::tuning, else TMX_VULKAN_TUNING):
// "" (unset) the device's file in cache_dir() if there is one; "off" none; anything else a file.
struct TuningSource {
    enum class Kind { DeviceFile, Off, File } kind = Kind::DeviceFile;
    std::string path;
};
TuningSource tuning_source(const std::optional<std::string>& requested);

// The tuning a device starts with: the file of tuning_source(requested), parsed and checked.
struct LoadedTuning {
    std::optional<TuningFile> file;  // set when a file applies
    std::string path;
    // "tuned (N shapes, FILE)", "untuned", "untuned (TMX_VULKAN_TUNING=off)", or
    // "untuned (refused FILE: why)".
    std::string status = "untuned";
    std::string refused;  // why a file was refused; empty otherwise
};
LoadedTuning load_tuning(const DeviceInfo& d, const std::optional<std::string>& requested);

// The backend's choices: forced variants, then tuned ones, then the defaults.
class TuningTable {
  public:
    explicit TuningTable(const DeviceInfo& d);

    // The variant a call runs with.
    Variant choose(Kernel kernel, int64_t rows, int64_t n, int64_t k, uint32_t layout) const;
    // The built-in choice for the device and the call's size, tuning aside.
    Variant default_variant(Kernel kernel, int64_t rows, int64_t n, int64_t k,
                            uint32_t layout) const;

    // Every call of `kernel` runs `v` (nullopt: back to tuned and default choices). Throws
    // tmx::Error when the device cannot run it.
    void force(Kernel kernel, std::optional<Variant> v);
    // Forces from a list "kernel=variant[,kernel=variant...]" (TMX_VULKAN_FORCE_VARIANT); throws
    // tmx::Error naming the part that is wrong.
    void force_from_list(std::string_view list);
    // Takes a file's shapes (after check_tuning_applies).
    void set_tuned(const TuningFile& f, const std::string& path);
    size_t tuned_shapes() const { return tuned_.size(); }
    const std::string& tuned_from() const { return tuned_from_; }

  private:
    const DeviceInfo* device_;
    std::array<std::optional<Variant>, kKernelCount> forced_;
    std::map<ShapeKey, Variant> tuned_;
    std::string tuned_from_;
    // The defaults: large tiles for big products, small ones otherwise, skinny ones for few
    // rows; the matrix-vector shapes (dense, grouped); prefill attention's.
    Variant large_, small_, skinny_, gemv_, grouped_gemv_, attention_, split_;
    uint32_t skinny_max_rows_ = 32;
};

}  // namespace tmx::vk
