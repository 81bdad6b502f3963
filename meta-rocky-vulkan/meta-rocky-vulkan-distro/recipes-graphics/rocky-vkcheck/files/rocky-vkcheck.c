/*
 * rocky-vkcheck: a targeted Vulkan compute conformance check for what the panvk patch series
 * (patches/mesa-000{1,2,3}-*.patch) changes: a TLS (stack) buffer shared by the device and grown
 * while older command buffers are pending, one WLS (shared memory) buffer reused by the
 * dispatches of a command buffer, secondaries, resets and simultaneous use. Every result is
 * compared with a CPU reference computed here.
 *
 * Output: one JSON document on stdout (docs/dev/formats.md, "rocky-vkcheck"), progress on
 * stderr. Exit status: 0 every check passed, 1 a result differs from the CPU reference,
 * 2 usage error or no usable Vulkan device, 3 a Vulkan call failed (or a fence wait timed out).
 *
 * SPDX-License-Identifier: MIT
 */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vulkan/vulkan.h>

#define PROGRAM_VERSION "1.0.0"
#define SCHEMA "rocky-vkcheck"
#define SCHEMA_VERSION 1

enum { EXIT_PASS = 0, EXIT_MISMATCH = 1, EXIT_USAGE = 2, EXIT_VULKAN = 3 };

static const uint32_t spill_spv[] =
#include "spill.spv.inc"
    ;
static const uint32_t wls_spv[] =
#include "wls.spv.inc"
    ;

/* Keep in step with shaders/spill.comp and shaders/wls.comp. */
#define LOCAL_SIZE 64u
#define IDX_WORDS 4096u
#define SPILL_COUNT 2048u    /* invocations (result words) of a spill dispatch */
#define SPILL_ROUNDS 48u
#define WLS_GROUPS 32u       /* workgroups of a WLS dispatch: 64 result words each */
#define RESULT_WORDS (1u << 20)
#define SENTINEL 0xDEADBEEFu
#define MAX_QUEUES 2
#define MAX_CASES 160
#define MAX_PIPES 64
#define MAX_POOLS 16
#define MAX_FENCES 64
#define MAX_SPILL 1536u

enum kind { SPILL, WLS };

struct kase {
   char name[96];
   enum kind kind;
   uint32_t size;  /* private-array words (SPILL) or shared-memory words (WLS) */
   uint32_t times; /* 0: stored once; n > 0: atomically added by n executions */
   uint32_t tag, base, words;
};

struct plan {
   struct kase k[MAX_CASES];
   unsigned n;
};

struct ctx_s;

struct check {
   const char *name;
   const char *what;
   int (*run)(struct ctx_s *, struct check *);
   bool ran;
   unsigned cases, passed, failed;
   bool mismatch;
   char mm_case[96];
   uint32_t mm_word, mm_expected, mm_got;
   double seconds;
};

struct pipe {
   enum kind kind;
   uint32_t size, accum;
   VkPipeline pipeline;
};

struct ctx_s {
   VkInstance instance;
   VkPhysicalDevice phys;
   VkDevice dev;
   int device_index;
   VkPhysicalDeviceProperties props;
   bool have_driver_props;
   VkPhysicalDeviceDriverProperties driver;
   uint32_t subgroup_size;
   unsigned nqueues;
   VkQueue queue[MAX_QUEUES];
   uint32_t family[MAX_QUEUES], qindex[MAX_QUEUES];
   uint32_t max_wls_words;

   VkBuffer idx_buf, res_buf;
   VkDeviceMemory idx_mem, res_mem;
   uint32_t *idx, *res;
   uint32_t res_next, next_tag;
   VkDescriptorSetLayout dsl;
   VkPipelineLayout layout;
   VkDescriptorPool dpool;
   VkDescriptorSet set;
   VkShaderModule module[2];
   struct pipe pipes[MAX_PIPES];
   unsigned npipes;
   VkCommandPool pools[MAX_POOLS];
   unsigned npools;
   VkFence fences[MAX_FENCES];
   unsigned nfences;

   uint64_t timeout_ns;
   unsigned timeout_s;
   const char *inject;
   bool injected;
   struct check *current;

   bool vk_failed, timed_out, no_device;
   char err_call[64];
   VkResult err_result;
   char err_msg[320];
   const char *err_check;
};
typedef struct ctx_s ctx;

/* ---------------------------------------------------------------------------------------- */

static const char *vk_result_name(VkResult r)
{
   switch (r) {
#define R(x) case x: return #x
      R(VK_SUCCESS); R(VK_NOT_READY); R(VK_TIMEOUT); R(VK_EVENT_SET); R(VK_EVENT_RESET);
      R(VK_INCOMPLETE); R(VK_ERROR_OUT_OF_HOST_MEMORY); R(VK_ERROR_OUT_OF_DEVICE_MEMORY);
      R(VK_ERROR_INITIALIZATION_FAILED); R(VK_ERROR_DEVICE_LOST); R(VK_ERROR_MEMORY_MAP_FAILED);
      R(VK_ERROR_LAYER_NOT_PRESENT); R(VK_ERROR_EXTENSION_NOT_PRESENT);
      R(VK_ERROR_FEATURE_NOT_PRESENT); R(VK_ERROR_INCOMPATIBLE_DRIVER);
      R(VK_ERROR_TOO_MANY_OBJECTS); R(VK_ERROR_FORMAT_NOT_SUPPORTED);
      R(VK_ERROR_FRAGMENTED_POOL); R(VK_ERROR_UNKNOWN); R(VK_ERROR_OUT_OF_POOL_MEMORY);
      R(VK_ERROR_INVALID_EXTERNAL_HANDLE); R(VK_ERROR_FRAGMENTATION);
      R(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS);
#undef R
   default:
      return NULL;
   }
}

static void result_text(VkResult r, char *out, size_t len)
{
   const char *name = vk_result_name(r);
   if (name)
      snprintf(out, len, "%s", name);
   else
      snprintf(out, len, "VkResult(%d)", (int)r);
}

static int vk_fail(ctx *c, const char *call, VkResult r, const char *fmt, ...)
{
   if (!c->vk_failed) {
      char name[48];
      c->vk_failed = true;
      c->err_result = r;
      c->err_check = c->current ? c->current->name : NULL;
      snprintf(c->err_call, sizeof(c->err_call), "%s", call);
      result_text(r, name, sizeof(name));
      if (fmt) {
         va_list ap;
         va_start(ap, fmt);
         vsnprintf(c->err_msg, sizeof(c->err_msg), fmt, ap);
         va_end(ap);
      } else {
         snprintf(c->err_msg, sizeof(c->err_msg), "%s returned %s", call, name);
      }
      fprintf(stderr, "rocky-vkcheck: %s%s%s\n", c->err_check ? c->err_check : "",
              c->err_check ? ": " : "", c->err_msg);
   }
   return -1;
}

/* Every Vulkan call that returns a VkResult goes through this. */
#define VK(c, fn, args)                                                                        \
   do {                                                                                        \
      VkResult r_ = fn args;                                                                   \
      if (r_ != VK_SUCCESS)                                                                    \
         return vk_fail((c), #fn, r_, NULL);                                                   \
   } while (0)

static double now_s(void)
{
   struct timespec ts;
   clock_gettime(CLOCK_MONOTONIC, &ts);
   return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- CPU reference (keep in step with shaders/spill.comp and shaders/wls.comp) ----------------------------------- */

static uint32_t lcg(uint32_t x) { return x * 1664525u + 1013904223u; }

static uint32_t mix32(uint32_t x)
{
   x ^= x >> 16;
   x *= 0x7feb352du;
   x ^= x >> 15;
   x *= 0x846ca68bu;
   x ^= x >> 16;
   return x;
}

static uint32_t spill_ref(const uint32_t *idx, uint32_t n, uint32_t tag, uint32_t gid,
                          uint32_t rounds, uint32_t *arr)
{
   uint32_t x = tag ^ (gid * 0x9E3779B9u);
   for (uint32_t i = 0; i < n; i++) {
      x = lcg(x);
      arr[i] = x;
   }
   uint32_t acc = 0;
   for (uint32_t r = 0; r < rounds; r++) {
      x = lcg(x);
      uint32_t j = (x >> 8) % n;
      uint32_t k = idx[(gid + r * 7u) % IDX_WORDS] % n;
      arr[j] ^= arr[k] + r;
      acc = acc * 31u + arr[(j + k) % n];
   }
   return acc ^ arr[x % n];
}

/* The 64 results of one workgroup of wls.comp. */
static void wls_ref(uint32_t s, uint32_t tag, uint32_t wg, uint32_t *sh, uint32_t out[64])
{
   uint32_t salt = (tag * 0x9E3779B9u) ^ (wg * 0x85EBCA6Bu);
   uint32_t acc[64];
   for (uint32_t i = 0; i < s; i++)
      sh[i] = mix32(salt + i);
   for (uint32_t l = 0; l < 64; l++) {
      acc[l] = 0;
      for (uint32_t i = (l + 1) % 64; i < s; i += 64)
         acc[l] = acc[l] * 31u + sh[i];
   }
   for (uint32_t i = 0; i < s; i++)
      sh[i] = mix32(sh[i] ^ acc[i % 64]);
   for (uint32_t l = 0; l < 64; l++) {
      for (uint32_t i = (l + 1) % 64; i < s; i += 64)
         acc[l] = acc[l] * 37u + sh[i];
      out[l] = acc[l];
   }
}

/* ---- plans: what each dispatch writes, and the check against the CPU -------------------- */

static struct kase *plan_add(ctx *c, struct plan *p, enum kind kind, uint32_t size,
                             uint32_t times, const char *fmt, ...)
{
   uint32_t words = kind == SPILL ? SPILL_COUNT : WLS_GROUPS * LOCAL_SIZE;
   if (p->n >= MAX_CASES || RESULT_WORDS - c->res_next < words) {
      fprintf(stderr, "rocky-vkcheck: internal error: too many cases for the result buffer\n");
      abort();
   }
   struct kase *k = &p->k[p->n++];
   va_list ap;
   va_start(ap, fmt);
   vsnprintf(k->name, sizeof(k->name), fmt, ap);
   va_end(ap);
   k->kind = kind;
   k->size = size;
   k->times = times;
   k->tag = 0x51000u + c->next_tag++;
   k->base = c->res_next;
   k->words = words;
   c->res_next += words;
   return k;
}

/* Sentinel in stored regions, zero in accumulated ones (before a submission). */
static void plan_prepare(ctx *c, const struct plan *p)
{
   for (unsigned i = 0; i < p->n; i++) {
      const struct kase *k = &p->k[i];
      for (uint32_t w = 0; w < k->words; w++)
         c->res[k->base + w] = k->times ? 0u : SENTINEL;
   }
}

static void verify_case(ctx *c, struct check *chk, const struct kase *k, const char *round)
{
   static uint32_t scratch[MAX_SPILL > 8192 ? MAX_SPILL : 8192];
   uint32_t *got = c->res + k->base;
   uint32_t mult = k->times ? k->times : 1u;
   bool ok = true;
   uint32_t bad = 0, expected_bad = 0;

   if (c->inject && !c->injected && strcmp(c->inject, chk->name) == 0) {
      got[k->words / 2] ^= 1u; /* test only (--inject-mismatch): one corrupted result */
      c->injected = true;
   }
   if (k->kind == SPILL) {
      for (uint32_t gid = 0; gid < k->words && ok; gid++) {
         uint32_t want = mult * spill_ref(c->idx, k->size, k->tag, gid, SPILL_ROUNDS, scratch);
         if (got[gid] != want) {
            ok = false;
            bad = gid;
            expected_bad = want;
         }
      }
   } else {
      uint32_t out[64];
      for (uint32_t wg = 0; wg < WLS_GROUPS && ok; wg++) {
         wls_ref(k->size, k->tag, wg, scratch, out);
         for (uint32_t l = 0; l < 64 && ok; l++) {
            if (got[wg * 64 + l] != mult * out[l]) {
               ok = false;
               bad = wg * 64 + l;
               expected_bad = mult * out[l];
            }
         }
      }
   }
   chk->cases++;
   if (ok) {
      chk->passed++;
      return;
   }
   chk->failed++;
   if (!chk->mismatch) {
      chk->mismatch = true;
      snprintf(chk->mm_case, sizeof(chk->mm_case), "%s%s", k->name, round);
      chk->mm_word = bad;
      chk->mm_expected = expected_bad;
      chk->mm_got = got[bad];
   }
}

static void plan_verify(ctx *c, struct check *chk, const struct plan *p, const char *round)
{
   for (unsigned i = 0; i < p->n; i++)
      verify_case(c, chk, &p->k[i], round);
}

/* ---- Vulkan objects ---------------------------------------------------------------------- */

static int get_pipeline(ctx *c, enum kind kind, uint32_t size, uint32_t accum, VkPipeline *out)
{
   for (unsigned i = 0; i < c->npipes; i++) {
      struct pipe *p = &c->pipes[i];
      if (p->kind == kind && p->size == size && p->accum == accum) {
         *out = p->pipeline;
         return 0;
      }
   }
   if (c->npipes >= MAX_PIPES) {
      fprintf(stderr, "rocky-vkcheck: internal error: too many pipelines\n");
      abort();
   }
   uint32_t data[2] = {size, accum};
   VkSpecializationMapEntry entries[2] = {{0, 0, 4}, {1, 4, 4}};
   VkSpecializationInfo spec = {2, entries, sizeof(data), data};
   VkComputePipelineCreateInfo info = {
      .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
      .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                .module = c->module[kind],
                .pName = "main",
                .pSpecializationInfo = &spec},
      .layout = c->layout,
   };
   VkPipeline pipeline = VK_NULL_HANDLE;
   VK(c, vkCreateComputePipelines, (c->dev, VK_NULL_HANDLE, 1, &info, NULL, &pipeline));
   c->pipes[c->npipes++] = (struct pipe){kind, size, accum, pipeline};
   *out = pipeline;
   return 0;
}

static int new_pool(ctx *c, unsigned q, VkCommandPoolCreateFlags flags, VkCommandPool *out)
{
   if (c->npools >= MAX_POOLS) {
      fprintf(stderr, "rocky-vkcheck: internal error: too many command pools\n");
      abort();
   }
   VkCommandPoolCreateInfo info = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = flags,
                                   .queueFamilyIndex = c->family[q]};
   VK(c, vkCreateCommandPool, (c->dev, &info, NULL, out));
   c->pools[c->npools++] = *out;
   return 0;
}

static int alloc_cbs(ctx *c, VkCommandPool pool, VkCommandBufferLevel level, uint32_t n,
                     VkCommandBuffer *out)
{
   VkCommandBufferAllocateInfo info = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                       .commandPool = pool,
                                       .level = level,
                                       .commandBufferCount = n};
   VK(c, vkAllocateCommandBuffers, (c->dev, &info, out));
   return 0;
}

static int new_fences(ctx *c, unsigned n, VkFence *out)
{
   if (c->nfences + n > MAX_FENCES) {
      fprintf(stderr, "rocky-vkcheck: internal error: too many fences\n");
      abort();
   }
   VkFenceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
   for (unsigned i = 0; i < n; i++) {
      VK(c, vkCreateFence, (c->dev, &info, NULL, &out[i]));
      c->fences[c->nfences++] = out[i];
   }
   return 0;
}

static int begin(ctx *c, VkCommandBuffer cb, VkCommandBufferUsageFlags flags, bool secondary)
{
   VkCommandBufferInheritanceInfo inherit = {
      .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_INHERITANCE_INFO};
   VkCommandBufferBeginInfo info = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                    .flags = flags,
                                    .pInheritanceInfo = secondary ? &inherit : NULL};
   VK(c, vkBeginCommandBuffer, (cb, &info));
   return 0;
}

static int end(ctx *c, VkCommandBuffer cb)
{
   VK(c, vkEndCommandBuffer, (cb));
   return 0;
}

/* A fence makes device writes available to the device only: a primary ends with a barrier that
 * makes its shaders' writes visible to the host, which reads them after the fence wait. */
static int end_primary(ctx *c, VkCommandBuffer cb)
{
   VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                         .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                         .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
   vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0,
                        1, &mb, 0, NULL, 0, NULL);
   return end(c, cb);
}

/* Record the dispatch that writes case k (no barrier before or after it). */
static int rec(ctx *c, VkCommandBuffer cb, const struct kase *k)
{
   VkPipeline pipeline = VK_NULL_HANDLE;
   if (get_pipeline(c, k->kind, k->size, k->times ? 1u : 0u, &pipeline))
      return -1;
   uint32_t push[4] = {k->tag, k->base, SPILL_COUNT, SPILL_ROUNDS};
   vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
   vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, c->layout, 0, 1, &c->set, 0,
                           NULL);
   vkCmdPushConstants(cb, c->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(push), push);
   vkCmdDispatch(cb, k->kind == SPILL ? SPILL_COUNT / LOCAL_SIZE : WLS_GROUPS, 1, 1);
   return 0;
}

static void compute_barrier(VkCommandBuffer cb)
{
   VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                         .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                         .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
   vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                        VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
}

static int submit(ctx *c, unsigned q, uint32_t n, const VkCommandBuffer *cbs, VkFence fence)
{
   VkSubmitInfo info = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                        .commandBufferCount = n,
                        .pCommandBuffers = cbs};
   VK(c, vkQueueSubmit, (c->queue[q], 1, &info, fence));
   return 0;
}

/* Every fence wait is bounded: a device that never signals is an error, not a hang. */
static int wait_all(ctx *c, uint32_t n, const VkFence *fences)
{
   VkResult r = vkWaitForFences(c->dev, n, fences, VK_TRUE, c->timeout_ns);
   if (r == VK_TIMEOUT) {
      c->timed_out = true;
      return vk_fail(c, "vkWaitForFences", r,
                     "vkWaitForFences returned VK_TIMEOUT: the GPU work did not finish within "
                     "%u s (a GPU hang, or a device that never signals its fences); raise "
                     "--timeout-s if the device is merely slow",
                     c->timeout_s);
   }
   if (r != VK_SUCCESS)
      return vk_fail(c, "vkWaitForFences", r, NULL);
   VK(c, vkResetFences, (c->dev, n, fences));
   return 0;
}

/* ---- the checks ---------------------------------------------------------------------------- */

static const uint32_t tls_sizes[] = {16, 64, 256, 768, MAX_SPILL};
#define NTLS (sizeof(tls_sizes) / sizeof(tls_sizes[0]))


/* Shared-memory words: as asked, within the device's limit (a multiple of 64). */
static uint32_t wsz(const ctx *c, uint32_t words)
{
   return words < c->max_wls_words ? words : c->max_wls_words;
}

static int record_cases(ctx *c, VkCommandBuffer cb, const struct plan *p, unsigned from,
                        unsigned to)
{
   for (unsigned i = from; i < to; i++)
      if (rec(c, cb, &p->k[i]))
         return -1;
   return 0;
}

/* (a) Spilling shaders on every queue while the device TLS grows: each command buffer is
 * recorded (and ended, where panvk sizes TLS) after the previous ones were submitted and are
 * still pending; then all of them are submitted again, largest stack first, so buffers of
 * every stride are in use at once. */
static int check_tls(ctx *c, struct check *chk)
{
   static struct plan p;
   VkCommandPool pool[MAX_QUEUES];
   VkCommandBuffer cb[NTLS * MAX_QUEUES];
   VkFence fence[NTLS * MAX_QUEUES];
   const unsigned nq = c->nqueues, n = NTLS * c->nqueues;

   p.n = 0;
   for (unsigned q = 0; q < nq; q++)
      if (new_pool(c, q, 0, &pool[q]))
         return -1;
   if (new_fences(c, n, fence))
      return -1;
   for (unsigned si = 0; si < NTLS; si++) {
      for (unsigned q = 0; q < nq; q++) {
         plan_add(c, &p, SPILL, tls_sizes[si], 0, "stack %u words, queue %u", tls_sizes[si], q);
         plan_add(c, &p, SPILL, tls_sizes[si / 2], 0, "stack %u words after %u, queue %u",
                  tls_sizes[si / 2], tls_sizes[si], q);
      }
   }
   plan_prepare(c, &p);
   for (unsigned i = 0; i < n; i++) {
      unsigned q = i % nq;
      if (alloc_cbs(c, pool[q], VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1, &cb[i]) ||
          begin(c, cb[i], 0, false) || record_cases(c, cb[i], &p, 2 * i, 2 * i + 2) ||
          end_primary(c, cb[i]) || submit(c, q, 1, &cb[i], fence[i]))
         return -1;
   }
   if (wait_all(c, n, fence))
      return -1;
   plan_verify(c, chk, &p, " (first submission)");
   plan_prepare(c, &p);
   for (unsigned i = n; i-- > 0;)
      if (submit(c, i % nq, 1, &cb[i], fence[i]))
         return -1;
   if (wait_all(c, n, fence))
      return -1;
   plan_verify(c, chk, &p, " (resubmitted, largest stack first)");
   return 0;
}

/* (b) Many dispatches with different shared-memory sizes and no barrier between them (one
 * compute-to-compute barrier halfway), dispatches without shared memory in between; one
 * command buffer per queue, both pending at once. */
static int check_wls(ctx *c, struct check *chk)
{
   static struct plan p;
   static const uint32_t sizes[] = {64, 128, 256, 512, 1024, 2048, 4096, 8192};
   const unsigned ns = sizeof(sizes) / sizeof(sizes[0]), nq = c->nqueues;
   uint32_t order[64];
   unsigned no = 0, barrier_at[MAX_QUEUES], first[MAX_QUEUES + 1];
   VkCommandPool pool[MAX_QUEUES];
   VkCommandBuffer cb[MAX_QUEUES];
   VkFence fence[MAX_QUEUES];
   uint32_t x = 12345;

   p.n = 0;
   for (unsigned i = 0; i < ns; i++) /* growing: each dispatch gets a new buffer */
      order[no++] = sizes[i];
   for (unsigned i = ns; i-- > 0;) /* shrinking: each one reuses the buffer */
      order[no++] = sizes[i];
   for (unsigned i = 0; i < 24; i++) {
      x = lcg(x);
      order[no++] = sizes[(x >> 16) % ns];
   }
   for (unsigned q = 0; q < nq; q++) {
      first[q] = p.n;
      barrier_at[q] = ~0u;
      for (unsigned i = 0; i < no; i++) {
         if (i == 2 * ns)
            barrier_at[q] = p.n;
         plan_add(c, &p, WLS, wsz(c, order[i]), 0, "dispatch %u, %u shared words, queue %u", i,
                  wsz(c, order[i]), q);
         if (i % 5 == 4)
            plan_add(c, &p, SPILL, 64, 0, "no shared memory after dispatch %u, queue %u", i, q);
      }
   }
   first[nq] = p.n;
   plan_prepare(c, &p);
   if (new_fences(c, nq, fence))
      return -1;
   for (unsigned q = 0; q < nq; q++) {
      if (new_pool(c, q, 0, &pool[q]) ||
          alloc_cbs(c, pool[q], VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1, &cb[q]) ||
          begin(c, cb[q], VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, false) ||
          record_cases(c, cb[q], &p, first[q], barrier_at[q]))
         return -1;
      compute_barrier(cb[q]);
      if (record_cases(c, cb[q], &p, barrier_at[q], first[q + 1]) || end_primary(c, cb[q]))
         return -1;
   }
   for (unsigned q = 0; q < nq; q++)
      if (submit(c, q, 1, &cb[q], fence[q]))
         return -1;
   if (wait_all(c, nq, fence))
      return -1;
   plan_verify(c, chk, &p, "");
   return 0;
}

/* (c1) Secondaries executed from primaries between direct dispatches (no barriers), each with
 * its own TLS and WLS use; and a primary that only executes secondaries, on the last queue. */
static int check_secondaries(ctx *c, struct check *chk)
{
   static struct plan p;
   const unsigned ql = c->nqueues - 1;
   VkCommandPool pool0, pooll;
   VkCommandBuffer sec[6], p1, p2;
   VkFence fence[2];
   /* cases: per secondary, then the primary's own */
   static const struct { enum kind kind; uint32_t size; unsigned owner; } spec[] = {
      {WLS, 4096, 0}, {SPILL, MAX_SPILL, 0}, {WLS, 256, 1},  {SPILL, 64, 1},
      {SPILL, 768, 2}, {WLS, 8192, 2},      {WLS, 1024, 3}, {WLS, 2048, 4},
      {SPILL, 256, 4}, {SPILL, MAX_SPILL, 5}, {WLS, 512, 5}, {WLS, 512, 6},
      {WLS, 2048, 6},  {SPILL, 256, 6},     {WLS, 64, 6},
   };
   const unsigned nspec = sizeof(spec) / sizeof(spec[0]);
   unsigned at[8] = {0};

   p.n = 0;
   for (unsigned i = 0; i < nspec; i++) {
      uint32_t size = spec[i].kind == WLS ? wsz(c, spec[i].size) : spec[i].size;
      if (i == 0 || spec[i].owner != spec[i - 1].owner)
         at[spec[i].owner] = i;
      plan_add(c, &p, spec[i].kind, size, 0, "%s %u words in %s %u",
               spec[i].kind == WLS ? "shared" : "stack", size,
               spec[i].owner < 6 ? "secondary" : "primary", spec[i].owner);
   }
   at[7] = nspec;
   plan_prepare(c, &p);
   if (new_pool(c, 0, 0, &pool0) || new_pool(c, ql, 0, &pooll) ||
       alloc_cbs(c, pool0, VK_COMMAND_BUFFER_LEVEL_SECONDARY, 4, sec) ||
       alloc_cbs(c, pooll, VK_COMMAND_BUFFER_LEVEL_SECONDARY, 2, sec + 4) ||
       alloc_cbs(c, pool0, VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1, &p1) ||
       alloc_cbs(c, pooll, VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1, &p2) || new_fences(c, 2, fence))
      return -1;
   for (unsigned s = 0; s < 6; s++)
      if (begin(c, sec[s], 0, true) || record_cases(c, sec[s], &p, at[s], at[s + 1]) ||
          end(c, sec[s]))
         return -1;
   /* p1: direct, 2 secondaries, 2 direct, 2 secondaries, direct; no barrier anywhere */
   if (begin(c, p1, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, false) ||
       rec(c, p1, &p.k[at[6]]))
      return -1;
   vkCmdExecuteCommands(p1, 2, sec);
   if (rec(c, p1, &p.k[at[6] + 1]) || rec(c, p1, &p.k[at[6] + 2]))
      return -1;
   vkCmdExecuteCommands(p1, 2, sec + 2);
   if (rec(c, p1, &p.k[at[6] + 3]) || end_primary(c, p1))
      return -1;
   /* p2: only secondaries */
   if (begin(c, p2, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, false))
      return -1;
   vkCmdExecuteCommands(p2, 2, sec + 4);
   if (end_primary(c, p2) || submit(c, 0, 1, &p1, fence[0]) || submit(c, ql, 1, &p2, fence[1]) ||
       wait_all(c, 2, fence))
      return -1;
   plan_verify(c, chk, &p, "");
   return 0;
}

/* Record, submit, wait, compare: one round of check_reset. */
static int reset_round(ctx *c, struct check *chk, unsigned q, VkCommandBuffer cb,
                       const struct plan *p, VkFence fence, const char *round)
{
   plan_prepare(c, p);
   if (submit(c, q, 1, &cb, fence) || wait_all(c, 1, &fence))
      return -1;
   plan_verify(c, chk, p, round);
   return 0;
}

/* (c2) Command buffer resets and re-records: vkResetCommandBuffer (primary and secondary),
 * re-recording without a reset, vkResetCommandPool; with growing and shrinking stacks. */
static int check_reset(ctx *c, struct check *chk)
{
   static struct plan p;
   const unsigned ql = c->nqueues - 1;
   VkCommandPool poolr, poolp;
   VkCommandBuffer a, s, b[2];
   VkFence fence[2];

   if (new_pool(c, 0, VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, &poolr) ||
       alloc_cbs(c, poolr, VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1, &a) ||
       alloc_cbs(c, poolr, VK_COMMAND_BUFFER_LEVEL_SECONDARY, 1, &s) || new_fences(c, 2, fence))
      return -1;

   p.n = 0;
   plan_add(c, &p, SPILL, 64, 0, "stack 64 words, first recording");
   plan_add(c, &p, WLS, wsz(c, 1024), 0, "shared %u words, first recording", wsz(c, 1024));
   if (begin(c, a, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, false) ||
       record_cases(c, a, &p, 0, p.n) || end_primary(c, a) ||
       reset_round(c, chk, 0, a, &p, fence[0], ""))
      return -1;

   VK(c, vkResetCommandBuffer, (a, VK_COMMAND_BUFFER_RESET_RELEASE_RESOURCES_BIT));
   p.n = 0;
   plan_add(c, &p, SPILL, MAX_SPILL, 0, "stack %u words after vkResetCommandBuffer", MAX_SPILL);
   plan_add(c, &p, WLS, wsz(c, 8192), 0, "shared %u words after vkResetCommandBuffer",
            wsz(c, 8192));
   if (begin(c, a, 0, false) || record_cases(c, a, &p, 0, p.n) || end_primary(c, a) ||
       reset_round(c, chk, 0, a, &p, fence[0], ""))
      return -1;

   /* vkBeginCommandBuffer resets it implicitly (the pool allows it) */
   p.n = 0;
   plan_add(c, &p, WLS, wsz(c, 2048), 0, "shared %u words in a secondary", wsz(c, 2048));
   plan_add(c, &p, SPILL, 768, 0, "stack 768 words in a secondary");
   plan_add(c, &p, WLS, wsz(c, 128), 0, "shared %u words re-recorded without a reset",
            wsz(c, 128));
   if (begin(c, s, 0, true) || record_cases(c, s, &p, 0, 2) || end(c, s) ||
       begin(c, a, 0, false))
      return -1;
   vkCmdExecuteCommands(a, 1, &s);
   if (rec(c, a, &p.k[2]) || end_primary(c, a) || reset_round(c, chk, 0, a, &p, fence[0], ""))
      return -1;

   VK(c, vkResetCommandBuffer, (s, 0));
   p.n = 0;
   plan_add(c, &p, WLS, wsz(c, 64), 0, "shared %u words before a re-recorded secondary",
            wsz(c, 64));
   plan_add(c, &p, SPILL, 256, 0, "stack 256 words in a reset secondary");
   plan_add(c, &p, WLS, wsz(c, 4096), 0, "shared %u words in a reset secondary", wsz(c, 4096));
   if (begin(c, s, 0, true) || record_cases(c, s, &p, 1, 3) || end(c, s) ||
       begin(c, a, 0, false) || rec(c, a, &p.k[0]))
      return -1;
   vkCmdExecuteCommands(a, 1, &s);
   if (end_primary(c, a) || reset_round(c, chk, 0, a, &p, fence[0], ""))
      return -1;

   /* a pool without the reset flag: two command buffers, vkResetCommandPool, re-recorded */
   if (new_pool(c, ql, 0, &poolp) || alloc_cbs(c, poolp, VK_COMMAND_BUFFER_LEVEL_PRIMARY, 2, b))
      return -1;
   for (unsigned round = 0; round < 2; round++) {
      static const uint32_t sz[2][4] = {{768, 512, 4096, 16}, {256, MAX_SPILL, 8192, 64}};
      const char *when = round ? " after vkResetCommandPool" : "";
      p.n = 0;
      plan_add(c, &p, SPILL, sz[round][0], 0, "pool buffer 0: stack %u words%s", sz[round][0],
               when);
      plan_add(c, &p, WLS, wsz(c, sz[round][1]), 0, "pool buffer 0: shared %u words%s",
               wsz(c, sz[round][1]), when);
      plan_add(c, &p, WLS, wsz(c, sz[round][2]), 0, "pool buffer 1: shared %u words%s",
               wsz(c, sz[round][2]), when);
      plan_add(c, &p, SPILL, sz[round][3], 0, "pool buffer 1: stack %u words%s", sz[round][3],
               when);
      if (round)
         VK(c, vkResetCommandPool, (c->dev, poolp, 0));
      plan_prepare(c, &p);
      for (unsigned i = 0; i < 2; i++)
         if (begin(c, b[i], 0, false) || record_cases(c, b[i], &p, 2 * i, 2 * i + 2) ||
             end_primary(c, b[i]) || submit(c, ql, 1, &b[i], fence[i]))
            return -1;
      if (wait_all(c, 2, fence))
         return -1;
      plan_verify(c, chk, &p, "");
   }
   return 0;
}

/* (c3) SIMULTANEOUS_USE: a primary submitted once and then twice in one submission without a
 * wait, executing a SIMULTANEOUS_USE secondary twice; results are added atomically, so each
 * region must hold the single result times the number of executions. With two queues of one
 * family, a TLS-only command buffer also runs on both at once (WLS is left out there: two
 * simultaneous executions on two queues share its WLS memory, as in stock panvk). */
static int check_simultaneous(ctx *c, struct check *chk)
{
   static struct plan p;
   VkCommandPool pool;
   VkCommandBuffer s, t, u;
   VkFence fence[4];
   const VkCommandBufferUsageFlags sim = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT;

   p.n = 0;
   plan_add(c, &p, WLS, wsz(c, 2048), 3, "shared %u words, 3 executions", wsz(c, 2048));
   plan_add(c, &p, SPILL, 768, 3, "stack 768 words, 3 executions");
   plan_add(c, &p, WLS, wsz(c, 512), 6, "shared %u words in a secondary run twice per execution",
            wsz(c, 512));
   plan_prepare(c, &p);
   if (new_pool(c, 0, 0, &pool) || alloc_cbs(c, pool, VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1, &s) ||
       alloc_cbs(c, pool, VK_COMMAND_BUFFER_LEVEL_SECONDARY, 1, &t) || new_fences(c, 4, fence) ||
       begin(c, t, sim, true) || rec(c, t, &p.k[2]) || end(c, t) || begin(c, s, sim, false) ||
       record_cases(c, s, &p, 0, 2))
      return -1;
   VkCommandBuffer twice[2] = {t, t};
   vkCmdExecuteCommands(s, 2, twice);
   VkCommandBuffer ss[2] = {s, s};
   if (end_primary(c, s) || submit(c, 0, 1, &s, fence[0]) || submit(c, 0, 2, ss, fence[1]) ||
       wait_all(c, 2, fence))
      return -1;
   plan_verify(c, chk, &p, "");

   if (c->nqueues < 2 || c->family[0] != c->family[1]) {
      fprintf(stderr, "rocky-vkcheck: simultaneous_use: one queue (or two families): the "
                      "two-queue part is not run\n");
      return 0;
   }
   p.n = 0;
   plan_add(c, &p, SPILL, MAX_SPILL, 4, "stack %u words, 4 executions on 2 queues", MAX_SPILL);
   plan_add(c, &p, SPILL, 256, 4, "stack 256 words, 4 executions on 2 queues");
   plan_prepare(c, &p);
   if (alloc_cbs(c, pool, VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1, &u) || begin(c, u, sim, false) ||
       record_cases(c, u, &p, 0, 2) || end_primary(c, u))
      return -1;
   for (unsigned i = 0; i < 4; i++)
      if (submit(c, i % 2, 1, &u, fence[i]))
         return -1;
   if (wait_all(c, 4, fence))
      return -1;
   plan_verify(c, chk, &p, "");
   return 0;
}

static struct check checks[] = {
   {.name = "tls_growth",
    .what = "spilling shaders on every queue, TLS growing while older command buffers pend",
    .run = check_tls},
   {.name = "wls_no_barrier",
    .what = "dispatches with different shared-memory sizes and no barriers between them",
    .run = check_wls},
   {.name = "secondaries",
    .what = "secondary command buffers between direct dispatches; a primary of secondaries only",
    .run = check_secondaries},
   {.name = "reset_rerecord",
    .what = "vkResetCommandBuffer, re-recording, vkResetCommandPool",
    .run = check_reset},
   {.name = "simultaneous_use",
    .what = "SIMULTANEOUS_USE primaries and secondaries executed several times at once",
    .run = check_simultaneous},
};
#define NCHECKS (sizeof(checks) / sizeof(checks[0]))

/* ---- setup and teardown ------------------------------------------------------------------- */

static int no_device(ctx *c, const char *call, VkResult r, const char *fmt, ...)
{
   va_list ap;
   c->no_device = true;
   c->vk_failed = true;
   c->err_result = r;
   snprintf(c->err_call, sizeof(c->err_call), "%s", call);
   va_start(ap, fmt);
   vsnprintf(c->err_msg, sizeof(c->err_msg), fmt, ap);
   va_end(ap);
   fprintf(stderr, "rocky-vkcheck: %s\n", c->err_msg);
   return -1;
}

static int create_instance(ctx *c)
{
   uint32_t loader = VK_API_VERSION_1_0;
   VK(c, vkEnumerateInstanceVersion, (&loader));
   if (loader < VK_API_VERSION_1_1)
      return no_device(c, "vkEnumerateInstanceVersion", VK_ERROR_INCOMPATIBLE_DRIVER,
                       "the Vulkan loader is version 1.0; rocky-vkcheck needs 1.1 or newer");
   VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                            .pApplicationName = "rocky-vkcheck",
                            .apiVersion = loader >= VK_API_VERSION_1_2 ? VK_API_VERSION_1_2
                                                                       : VK_API_VERSION_1_1};
   VkInstanceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                .pApplicationInfo = &app};
   VkResult r = vkCreateInstance(&info, NULL, &c->instance);
   if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
      return no_device(c, "vkCreateInstance", r,
                       "vkCreateInstance returned VK_ERROR_INCOMPATIBLE_DRIVER: no Vulkan driver "
                       "is installed (on the board: mesa-vulkan-drivers, panvk)");
   if (r != VK_SUCCESS) {
      c->instance = VK_NULL_HANDLE;
      return vk_fail(c, "vkCreateInstance", r, NULL);
   }
   return 0;
}

static int pick_device(ctx *c, int wanted)
{
   VkPhysicalDevice devs[16];
   uint32_t n = 16;
   VkResult r = vkEnumeratePhysicalDevices(c->instance, &n, devs);
   if (r != VK_SUCCESS && r != VK_INCOMPLETE)
      return vk_fail(c, "vkEnumeratePhysicalDevices", r, NULL);
   if (n == 0)
      return no_device(c, "vkEnumeratePhysicalDevices", VK_ERROR_INITIALIZATION_FAILED,
                       "no Vulkan device: check the GPU driver (panthor) and the Vulkan driver "
                       "(panvk), e.g. with vulkaninfo --summary");
   if (wanted >= (int)n)
      return no_device(c, "vkEnumeratePhysicalDevices", VK_ERROR_INITIALIZATION_FAILED,
                       "--device %d: there are only %u Vulkan devices (0..%u)", wanted, n, n - 1);
   int chosen = wanted;
   if (chosen < 0) { /* the first that is not a CPU, else the first */
      chosen = 0;
      for (uint32_t i = 0; i < n; i++) {
         VkPhysicalDeviceProperties pr;
         vkGetPhysicalDeviceProperties(devs[i], &pr);
         if (pr.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU) {
            chosen = (int)i;
            break;
         }
      }
   }
   c->phys = devs[chosen];
   c->device_index = chosen;
   vkGetPhysicalDeviceProperties(c->phys, &c->props);
   if (c->props.apiVersion < VK_API_VERSION_1_1)
      return no_device(c, "vkGetPhysicalDeviceProperties", VK_ERROR_INCOMPATIBLE_DRIVER,
                       "device %d (%s) supports Vulkan 1.0 only; rocky-vkcheck needs 1.1",
                       chosen, c->props.deviceName);
   VkPhysicalDeviceSubgroupProperties sub = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
   c->driver = (VkPhysicalDeviceDriverProperties){
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
   c->have_driver_props = c->props.apiVersion >= VK_API_VERSION_1_2;
   if (c->have_driver_props)
      sub.pNext = &c->driver;
   VkPhysicalDeviceProperties2 props2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                         .pNext = &sub};
   vkGetPhysicalDeviceProperties2(c->phys, &props2);
   c->subgroup_size = sub.subgroupSize;
   uint32_t words = c->props.limits.maxComputeSharedMemorySize / 4 / 64 * 64;
   c->max_wls_words = words < 8192 ? words : 8192;
   if (c->max_wls_words < 64)
      return no_device(c, "vkGetPhysicalDeviceProperties", VK_ERROR_FEATURE_NOT_PRESENT,
                       "device %d has %u bytes of shared memory; rocky-vkcheck needs 256", chosen,
                       c->props.limits.maxComputeSharedMemorySize);
   return 0;
}

/* Every compute-capable queue, up to two: one of each family first. */
static int create_device(ctx *c)
{
   VkQueueFamilyProperties fam[16];
   uint32_t nfam = 16;
   vkGetPhysicalDeviceQueueFamilyProperties(c->phys, &nfam, fam);
   uint32_t used[16] = {0};
   for (int pass = 0; pass < 2 && c->nqueues < MAX_QUEUES; pass++) {
      for (uint32_t f = 0; f < nfam && c->nqueues < MAX_QUEUES; f++) {
         if (!(fam[f].queueFlags & VK_QUEUE_COMPUTE_BIT))
            continue;
         while (used[f] < fam[f].queueCount && c->nqueues < MAX_QUEUES &&
                (pass == 1 || used[f] == 0)) {
            c->family[c->nqueues] = f;
            c->qindex[c->nqueues] = used[f]++;
            c->nqueues++;
         }
      }
   }
   if (c->nqueues == 0)
      return no_device(c, "vkGetPhysicalDeviceQueueFamilyProperties",
                       VK_ERROR_FEATURE_NOT_PRESENT, "device %d (%s) has no compute queue",
                       c->device_index, c->props.deviceName);
   float prio[MAX_QUEUES] = {1.0f, 1.0f};
   VkDeviceQueueCreateInfo qinfo[MAX_QUEUES];
   uint32_t nq = 0;
   for (uint32_t f = 0; f < nfam; f++)
      if (used[f])
         qinfo[nq++] = (VkDeviceQueueCreateInfo){
            .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
            .queueFamilyIndex = f,
            .queueCount = used[f],
            .pQueuePriorities = prio};
   VkDeviceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                              .queueCreateInfoCount = nq,
                              .pQueueCreateInfos = qinfo};
   VK(c, vkCreateDevice, (c->phys, &info, NULL, &c->dev));
   for (unsigned q = 0; q < c->nqueues; q++)
      vkGetDeviceQueue(c->dev, c->family[q], c->qindex[q], &c->queue[q]);
   return 0;
}

static int host_buffer(ctx *c, VkDeviceSize size, VkBuffer *buf, VkDeviceMemory *mem,
                       uint32_t **map)
{
   VkBufferCreateInfo info = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                              .size = size,
                              .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                              .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
   VK(c, vkCreateBuffer, (c->dev, &info, NULL, buf));
   VkMemoryRequirements req;
   vkGetBufferMemoryRequirements(c->dev, *buf, &req);
   VkPhysicalDeviceMemoryProperties mp;
   vkGetPhysicalDeviceMemoryProperties(c->phys, &mp);
   const VkMemoryPropertyFlags want =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
   uint32_t type = UINT32_MAX;
   for (uint32_t i = 0; i < mp.memoryTypeCount && type == UINT32_MAX; i++)
      if ((req.memoryTypeBits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want)
         type = i;
   if (type == UINT32_MAX)
      return vk_fail(c, "vkGetPhysicalDeviceMemoryProperties", VK_ERROR_FEATURE_NOT_PRESENT,
                     "no host-visible, host-coherent memory type for a storage buffer");
   VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                              .allocationSize = req.size,
                              .memoryTypeIndex = type};
   VK(c, vkAllocateMemory, (c->dev, &ai, NULL, mem));
   VK(c, vkBindBufferMemory, (c->dev, *buf, *mem, 0));
   void *ptr;
   VK(c, vkMapMemory, (c->dev, *mem, 0, VK_WHOLE_SIZE, 0, &ptr));
   *map = ptr;
   return 0;
}

static int create_module(ctx *c, const uint32_t *code, size_t bytes, VkShaderModule *out)
{
   VkShaderModuleCreateInfo info = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                    .codeSize = bytes,
                                    .pCode = code};
   VK(c, vkCreateShaderModule, (c->dev, &info, NULL, out));
   return 0;
}

static int setup(ctx *c, int wanted)
{
   if (create_instance(c) || pick_device(c, wanted) || create_device(c) ||
       host_buffer(c, IDX_WORDS * 4u, &c->idx_buf, &c->idx_mem, &c->idx) ||
       host_buffer(c, (VkDeviceSize)RESULT_WORDS * 4u, &c->res_buf, &c->res_mem, &c->res))
      return -1;
   uint32_t x = 0xC0FFEEu;
   for (uint32_t i = 0; i < IDX_WORDS; i++) {
      x = lcg(x);
      c->idx[i] = x >> 7;
   }
   VkDescriptorSetLayoutBinding b[2] = {
      {0, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL},
      {1, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL}};
   VkDescriptorSetLayoutCreateInfo dsl = {
      .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
      .bindingCount = 2,
      .pBindings = b};
   VK(c, vkCreateDescriptorSetLayout, (c->dev, &dsl, NULL, &c->dsl));
   VkPushConstantRange range = {VK_SHADER_STAGE_COMPUTE_BIT, 0, 16};
   VkPipelineLayoutCreateInfo pl = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                    .setLayoutCount = 1,
                                    .pSetLayouts = &c->dsl,
                                    .pushConstantRangeCount = 1,
                                    .pPushConstantRanges = &range};
   VK(c, vkCreatePipelineLayout, (c->dev, &pl, NULL, &c->layout));
   VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 2};
   VkDescriptorPoolCreateInfo dp = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                    .maxSets = 1,
                                    .poolSizeCount = 1,
                                    .pPoolSizes = &ps};
   VK(c, vkCreateDescriptorPool, (c->dev, &dp, NULL, &c->dpool));
   VkDescriptorSetAllocateInfo da = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                     .descriptorPool = c->dpool,
                                     .descriptorSetCount = 1,
                                     .pSetLayouts = &c->dsl};
   VK(c, vkAllocateDescriptorSets, (c->dev, &da, &c->set));
   VkDescriptorBufferInfo bi[2] = {{c->idx_buf, 0, VK_WHOLE_SIZE},
                                   {c->res_buf, 0, VK_WHOLE_SIZE}};
   VkWriteDescriptorSet w[2];
   for (int i = 0; i < 2; i++)
      w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                    .dstSet = c->set,
                                    .dstBinding = (uint32_t)i,
                                    .descriptorCount = 1,
                                    .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                    .pBufferInfo = &bi[i]};
   vkUpdateDescriptorSets(c->dev, 2, w, 0, NULL);
   if (create_module(c, spill_spv, sizeof(spill_spv), &c->module[SPILL]) ||
       create_module(c, wls_spv, sizeof(wls_spv), &c->module[WLS]))
      return -1;
   return 0;
}

/* The command pools a check created (from index `from` on), once all its work is done. */
static void release_pools(ctx *c, unsigned from)
{
   while (c->npools > from)
      vkDestroyCommandPool(c->dev, c->pools[--c->npools], NULL);
}

/* After a fence wait timed out the GPU may still use every object: nothing is destroyed then
 * (the process exits and the kernel reclaims it all). */
static void teardown(ctx *c)
{
   if (c->timed_out)
      return;
   if (c->dev) {
      VkResult r = vkDeviceWaitIdle(c->dev);
      if (r != VK_SUCCESS) {
         vk_fail(c, "vkDeviceWaitIdle", r, NULL);
         if (r != VK_ERROR_DEVICE_LOST)
            return; /* work may still be pending: leave it to the kernel */
      }
      for (unsigned i = 0; i < c->nfences; i++)
         vkDestroyFence(c->dev, c->fences[i], NULL);
      for (unsigned i = 0; i < c->npools; i++)
         vkDestroyCommandPool(c->dev, c->pools[i], NULL);
      for (unsigned i = 0; i < c->npipes; i++)
         vkDestroyPipeline(c->dev, c->pipes[i].pipeline, NULL);
      for (int i = 0; i < 2; i++)
         if (c->module[i])
            vkDestroyShaderModule(c->dev, c->module[i], NULL);
      if (c->dpool)
         vkDestroyDescriptorPool(c->dev, c->dpool, NULL);
      if (c->layout)
         vkDestroyPipelineLayout(c->dev, c->layout, NULL);
      if (c->dsl)
         vkDestroyDescriptorSetLayout(c->dev, c->dsl, NULL);
      if (c->idx_buf)
         vkDestroyBuffer(c->dev, c->idx_buf, NULL);
      if (c->res_buf)
         vkDestroyBuffer(c->dev, c->res_buf, NULL);
      if (c->idx_mem)
         vkFreeMemory(c->dev, c->idx_mem, NULL);
      if (c->res_mem)
         vkFreeMemory(c->dev, c->res_mem, NULL);
      vkDestroyDevice(c->dev, NULL);
   }
   if (c->instance)
      vkDestroyInstance(c->instance, NULL);
}

/* ---- JSON ---------------------------------------------------------------------------------- */

/* A JSON string of printable ASCII: control characters escaped, other bytes as '?'. */
static void json_str(const char *s)
{
   putchar('"');
   for (; s && *s; s++) {
      unsigned char ch = (unsigned char)*s;
      if (ch == '"' || ch == '\\')
         printf("\\%c", ch);
      else if (ch < 0x20)
         printf("\\u%04x", ch);
      else if (ch >= 0x7f)
         putchar('?');
      else
         putchar(ch);
   }
   putchar('"');
}

static const char *device_type(VkPhysicalDeviceType t)
{
   switch (t) {
   case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated-gpu";
   case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete-gpu";
   case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual-gpu";
   case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
   default: return "other";
   }
}

static const char *check_status(const ctx *c, const struct check *k)
{
   if (c->vk_failed && c->err_check == k->name)
      return "error";
   if (!k->ran)
      return "not-run";
   return k->failed || k->cases == 0 ? "fail" : "pass";
}

static void emit_json(const ctx *c, int code)
{
   printf("{\n  \"schema\": \"%s\",\n  \"schema_version\": %d,\n", SCHEMA, SCHEMA_VERSION);
   printf("  \"program_version\": \"%s\",\n  \"device\": ", PROGRAM_VERSION);
   if (c->phys) {
      uint32_t v = c->props.apiVersion;
      printf("{\n    \"index\": %d,\n    \"name\": ", c->device_index);
      json_str(c->props.deviceName);
      printf(",\n    \"type\": \"%s\",\n    \"vendor_id\": %u,\n    \"device_id\": %u,\n",
             device_type(c->props.deviceType), c->props.vendorID, c->props.deviceID);
      printf("    \"api_version\": \"%u.%u.%u\",\n", VK_API_VERSION_MAJOR(v),
             VK_API_VERSION_MINOR(v), VK_API_VERSION_PATCH(v));
      printf("    \"driver_version\": %u,\n", c->props.driverVersion);
      if (c->have_driver_props) {
         printf("    \"driver_id\": %d,\n    \"driver_name\": ", (int)c->driver.driverID);
         json_str(c->driver.driverName);
         printf(",\n    \"driver_info\": ");
         json_str(c->driver.driverInfo);
         printf(",\n");
      } else {
         printf("    \"driver_id\": null,\n    \"driver_name\": null,\n"
                "    \"driver_info\": null,\n");
      }
      printf("    \"subgroup_size\": %u,\n    \"max_shared_memory_bytes\": %u\n  },\n",
             c->subgroup_size, c->props.limits.maxComputeSharedMemorySize);
   } else {
      printf("null,\n");
   }
   printf("  \"queues\": [");
   for (unsigned q = 0; q < c->nqueues && c->dev; q++)
      printf("%s{\"family\": %u, \"index\": %u}", q ? ", " : "", c->family[q], c->qindex[q]);
   printf("],\n  \"timeout_s\": %u,\n  \"inject_mismatch\": ", c->timeout_s);
   if (c->inject)
      json_str(c->inject);
   else
      printf("null");
   printf(",\n  \"checks\": [");
   for (unsigned i = 0; i < NCHECKS; i++) {
      const struct check *k = &checks[i];
      printf("%s\n    {\"name\": \"%s\", \"status\": \"%s\", \"cases\": %u, \"passed\": %u, "
             "\"failed\": %u, \"seconds\": %.3f,\n     \"first_mismatch\": ",
             i ? "," : "", k->name, check_status(c, k), k->cases, k->passed, k->failed,
             k->seconds);
      if (k->mismatch) {
         printf("{\"case\": ");
         json_str(k->mm_case);
         printf(", \"word\": %u, \"expected\": %u, \"got\": %u}}", k->mm_word, k->mm_expected,
                k->mm_got);
      } else {
         printf("null}");
      }
   }
   printf("\n  ],\n  \"error\": ");
   if (c->vk_failed) {
      char name[48];
      result_text(c->err_result, name, sizeof(name));
      printf("{\"check\": ");
      if (c->err_check)
         json_str(c->err_check);
      else
         printf("null");
      printf(", \"call\": ");
      json_str(c->err_call);
      printf(", \"result\": ");
      json_str(name);
      printf(", \"message\": ");
      json_str(c->err_msg);
      printf("}");
   } else {
      printf("null");
   }
   printf(",\n  \"passed\": %s,\n  \"exit_code\": %d\n}\n", code == EXIT_PASS ? "true" : "false",
          code);
   fflush(stdout);
}

/* ---- main ---------------------------------------------------------------------------------- */

static void usage(FILE *out)
{
   fprintf(out,
           "usage: rocky-vkcheck [--device N] [--timeout-s S] [--inject-mismatch CHECK]\n"
           "\n"
           "Vulkan compute checks for what the panvk patches change (shared TLS, WLS reuse,\n"
           "secondaries, resets, simultaneous use); every result is compared with a CPU\n"
           "reference. One JSON document on stdout (docs/dev/formats.md), progress on stderr.\n"
           "\n"
           "  --device N        the Nth Vulkan device (default: the first that is not a CPU)\n"
           "  --timeout-s S     bound of every fence wait, 1..3600 seconds (default 60)\n"
           "  --inject-mismatch CHECK\n"
           "                    TEST ONLY: corrupt one result of CHECK after the GPU wrote it,\n"
           "                    so the comparison must report it (proves the checker can fail)\n"
           "  --version, --help\n"
           "\n"
           "checks:");
   for (unsigned i = 0; i < NCHECKS; i++)
      fprintf(out, "%s %s", i ? "," : "", checks[i].name);
   fprintf(out, "\n\nexit status: 0 all passed, 1 a result differs from the CPU reference,\n"
                "2 usage or no usable Vulkan device, 3 a Vulkan call failed or timed out\n");
}

static bool parse_uint(const char *s, unsigned long lo, unsigned long hi, unsigned long *out)
{
   char *endp;
   if (!s || !*s || *s == '-' || *s == '+')
      return false;
   unsigned long v = strtoul(s, &endp, 10);
   if (*endp || v < lo || v > hi)
      return false;
   *out = v;
   return true;
}

int main(int argc, char **argv)
{
   static ctx c;
   int wanted = -1;
   unsigned long v;

   c.timeout_s = 60;
   for (int i = 1; i < argc; i++) {
      const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
      if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
         usage(stdout);
         return EXIT_PASS;
      } else if (!strcmp(a, "--version")) {
         printf("rocky-vkcheck %s\n", PROGRAM_VERSION);
         return EXIT_PASS;
      } else if (!strcmp(a, "--device") && parse_uint(next, 0, 15, &v)) {
         wanted = (int)v;
         i++;
      } else if (!strcmp(a, "--timeout-s") && parse_uint(next, 1, 3600, &v)) {
         c.timeout_s = (unsigned)v;
         i++;
      } else if (!strcmp(a, "--inject-mismatch") && next) {
         bool known = false;
         for (unsigned k = 0; k < NCHECKS; k++)
            known |= !strcmp(next, checks[k].name);
         if (!known) {
            fprintf(stderr, "rocky-vkcheck: --inject-mismatch: no check named '%s'\n", next);
            usage(stderr);
            return EXIT_USAGE;
         }
         c.inject = next;
         i++;
      } else {
         fprintf(stderr, "rocky-vkcheck: bad argument '%s'%s\n", a,
                 next || a[0] != '-' ? "" : " (a value is missing)");
         usage(stderr);
         return EXIT_USAGE;
      }
   }
   c.timeout_ns = (uint64_t)c.timeout_s * 1000000000ull;

   if (setup(&c, wanted) == 0) {
      fprintf(stderr, "rocky-vkcheck: device %d: %s, %u queue(s)\n", c.device_index,
              c.props.deviceName, c.nqueues);
      for (unsigned i = 0; i < NCHECKS && !c.vk_failed; i++) {
         struct check *k = &checks[i];
         double t0 = now_s();
         unsigned pools = c.npools;
         c.current = k;
         k->ran = true;
         if (k->run(&c, k) == 0)
            release_pools(&c, pools); /* each check starts with only its own command buffers */
         k->seconds = now_s() - t0;
         fprintf(stderr, "rocky-vkcheck: %s: %u/%u cases passed (%.2f s)%s%s\n", k->name,
                 k->passed, k->cases, k->seconds, k->mismatch ? "; first mismatch: " : "",
                 k->mismatch ? k->mm_case : "");
      }
      c.current = NULL;
   }
   teardown(&c);

   int code = EXIT_PASS;
   if (c.no_device)
      code = EXIT_USAGE;
   else if (c.vk_failed)
      code = EXIT_VULKAN;
   else
      for (unsigned i = 0; i < NCHECKS; i++)
         if (checks[i].failed || checks[i].cases == 0)
            code = EXIT_MISMATCH;
   emit_json(&c, code);
   return code;
}
