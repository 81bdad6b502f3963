#version 450
// rocky-vkcheck: a shader whose private array lives in thread-local storage (the stack).
// N words of private array, indexed with data-dependent indices, so no compiler can keep it
// in registers once N is large: its TLS (stack) size grows with N. rocky-vkcheck.c's
// spill_ref() computes the same values on the CPU; keep the two in step.
layout(local_size_x = 64) in;

layout(constant_id = 0) const uint N = 16;     // private array words
layout(constant_id = 1) const uint ACCUM = 0;  // 1: atomicAdd the result instead of storing it

layout(push_constant) uniform Params {
    uint tag;    // distinguishes dispatches: part of every value
    uint base;   // first word of this dispatch's region in res[]
    uint count;  // invocations that write a result
    uint rounds; // dynamic-index rounds
} pc;

layout(std430, binding = 0) readonly buffer Indices { uint idx[]; };
layout(std430, binding = 1) buffer Results { uint res[]; };

const uint IDX_WORDS = 4096;

uint lcg(uint x) { return x * 1664525u + 1013904223u; }

void main()
{
    uint gid = gl_GlobalInvocationID.x;
    if (gid >= pc.count)
        return;
    uint arr[N];
    uint x = pc.tag ^ (gid * 0x9E3779B9u);
    for (uint i = 0u; i < N; i++) {
        x = lcg(x);
        arr[i] = x;
    }
    uint acc = 0u;
    for (uint r = 0u; r < pc.rounds; r++) {
        x = lcg(x);
        uint j = (x >> 8) % N;
        uint k = idx[(gid + r * 7u) % IDX_WORDS] % N;
        arr[j] ^= arr[k] + r;
        acc = acc * 31u + arr[(j + k) % N];
    }
    uint value = acc ^ arr[x % N];
    if (ACCUM != 0u)
        atomicAdd(res[pc.base + gid], value);
    else
        res[pc.base + gid] = value;
}
