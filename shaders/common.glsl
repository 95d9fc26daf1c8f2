// Shared by the compute shaders (included; glslang resolves #include at build time).
//
// Conventions (backends/vulkan/vulkan_commands.h): every storage buffer is bound at a
// descriptor offset rounded down to the device's alignment, and the first push constants are
// one uint per binding, in binding order: the element offset of the tensor inside its binding.
// Larger grids are 2-D: group_index() numbers workgroups across x then y.

uint group_index() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

// -infinity: the running max before any score, and a masked or empty one.
#define NEG_INF uintBitsToFloat(0xff800000u)

// Error codes a shader reports in the status buffer; vulkan_backend.cpp words the message.
const uint ERR_GATHER_ROW = 2u;       // value: the row, limit: the row count
const uint ERR_EXPERT_INDEX = 3u;     // value: the expert, limit: the expert count
const uint ERR_TARGET = 4u;           // value: the target, limit: the vocabulary size
const uint ERR_SLOT = 5u;             // value: the slot, limit: the slot count

// The first error of a submit wins; later ones are dropped. Needs `uint status[]` in scope.
#define REPORT_ERROR(code, value, limit)                       \
    if (atomicCompSwap(status[0], 0u, (code)) == 0u) {         \
        status[1] = uint(value);                               \
        status[2] = uint(limit);                               \
    }
