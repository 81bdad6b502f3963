#version 450
// rocky-vkcheck: a shader that uses S words of workgroup-local (shared) memory. Every invocation
// fills its share of it, then reads what its neighbour wrote, twice; the checksum it stores is
// only right if no other dispatch wrote into the same memory meanwhile. rocky-vkcheck.c's
// wls_ref() computes the same values on the CPU; keep the two in step.
layout(local_size_x = 64) in;

layout(constant_id = 0) const uint S = 64;     // shared words (a multiple of 64)
layout(constant_id = 1) const uint ACCUM = 0;  // 1: atomicAdd the result instead of storing it

layout(push_constant) uniform Params {
    uint tag;
    uint base;
    uint count;  // unused: every invocation writes
    uint rounds; // unused
} pc;

layout(std430, binding = 1) buffer Results { uint res[]; };

shared uint sh[S];

uint mix32(uint x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

void main()
{
    uint lid = gl_LocalInvocationID.x;
    uint wg = gl_WorkGroupID.x;
    uint salt = (pc.tag * 0x9E3779B9u) ^ (wg * 0x85EBCA6Bu);
    for (uint i = lid; i < S; i += 64u)
        sh[i] = mix32(salt + i);
    barrier();
    uint acc = 0u;
    uint next = (lid + 1u) % 64u;
    for (uint i = next; i < S; i += 64u)
        acc = acc * 31u + sh[i];
    barrier();
    for (uint i = lid; i < S; i += 64u)
        sh[i] = mix32(sh[i] ^ acc);
    barrier();
    for (uint i = next; i < S; i += 64u)
        acc = acc * 37u + sh[i];
    uint at = pc.base + wg * 64u + lid;
    if (ACCUM != 0u)
        atomicAdd(res[at], acc);
    else
        res[at] = acc;
}
