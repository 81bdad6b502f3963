/*
 * rocky-vacount: an LD_PRELOAD ioctl wrapper that counts GPU virtual
 * address space mapped through DRM_IOCTL_PANTHOR_VM_BIND.
 *
 * panvk on a 48-bit VA GPU puts its private allocations (TLS, WLS, ring
 * buffers, descriptor pools) in [user_va_start, 4 GiB) and user memory
 * above 4 GiB, so VM_BIND maps below 4 GiB are exactly the private VA
 * heap.  The noop drm-shim accepts every bind without looking at it, so
 * this wrapper sits in front of it (first in LD_PRELOAD) and keeps the
 * current and peak totals.
 *
 * The totals are rewritten in ROCKY_VACOUNT_FILE whenever the peak grows,
 * because llama.cpp aborts on an uncaught Vulkan error and atexit
 * handlers would never run.
 *
 * The shim backs every BO with a range of one 4 GiB memfd and, when that
 * runs out, hands out a BO at offset 0 and later frees a range it never
 * allocated, which corrupts the heap (glibc aborts with "double free" or
 * "corrupted size").  On a board the kernel has no such limit, and panvk's
 * own private VA heap is what runs out.  So BOs created with
 * DRM_PANTHOR_BO_NO_MMAP (the TLS pool, ring buffers: GPU-only memory the
 * CPU cannot map) are created in the shim with one page and reported back with the size
 * panvk asked for; set ROCKY_SHIM_FULL_BOS=1 to turn this off.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <drm/drm.h>
#include <drm/panthor_drm.h>

#define PRIV_VA_END (1ull << 32)

static int (*real_ioctl)(int, unsigned long, ...);
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t priv_now, priv_peak, priv_max_map, user_now, user_peak;
static uint64_t n_maps, n_unmaps, nommap_bytes;
static int out_fd = -2;

static void
write_totals_locked(void)
{
   char line[256];
   int len;

   if (out_fd == -2) {
      const char *path = getenv("ROCKY_VACOUNT_FILE");
      out_fd = path ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
   }
   if (out_fd < 0)
      return;

   /* Fixed-width fields so a shorter rewrite never leaves stale digits. */
   len = snprintf(line, sizeof(line),
                  "priv_va_peak=%020llu priv_va_now=%020llu priv_va_max_map=%020llu "
                  "user_va_peak=%020llu maps=%012llu unmaps=%012llu "
                  "nommap_bo_bytes=%020llu\n",
                  (unsigned long long)priv_peak, (unsigned long long)priv_now,
                  (unsigned long long)priv_max_map, (unsigned long long)user_peak,
                  (unsigned long long)n_maps, (unsigned long long)n_unmaps,
                  (unsigned long long)nommap_bytes);
   if (len > 0)
      (void)!pwrite(out_fd, line, (size_t)len, 0);
}

static void
account(const struct drm_panthor_vm_bind *bind)
{
   const struct drm_panthor_vm_bind_op *ops =
      (const struct drm_panthor_vm_bind_op *)(uintptr_t)bind->ops.array;
   uint32_t stride = bind->ops.stride;
   bool changed = false;

   if (stride < offsetof(struct drm_panthor_vm_bind_op, syncs))
      return;

   pthread_mutex_lock(&lock);
   for (uint32_t i = 0; i < bind->ops.count; i++) {
      const struct drm_panthor_vm_bind_op *op =
         (const void *)((const char *)ops + (size_t)i * stride);
      uint32_t type = op->flags & DRM_PANTHOR_VM_BIND_OP_TYPE_MASK;
      bool priv = op->va < PRIV_VA_END;
      uint64_t *now = priv ? &priv_now : &user_now;

      if (type == DRM_PANTHOR_VM_BIND_OP_TYPE_MAP) {
         *now += op->size;
         n_maps++;
         if (priv && op->size > priv_max_map)
            priv_max_map = op->size;
      } else if (type == DRM_PANTHOR_VM_BIND_OP_TYPE_UNMAP) {
         *now = *now >= op->size ? *now - op->size : 0;
         n_unmaps++;
      }
      if (priv_now > priv_peak) {
         priv_peak = priv_now;
         changed = true;
      }
      if (user_now > user_peak)
         user_peak = user_now;
   }
   if (changed)
      write_totals_locked();
   pthread_mutex_unlock(&lock);
}

static int
create_bo(int fd, struct drm_panthor_bo_create *create)
{
   static int full_bos = -1;
   uint64_t size = create->size;
   int ret;

   if (full_bos < 0) {
      const char *env = getenv("ROCKY_SHIM_FULL_BOS");
      full_bos = env && env[0] == '1';
   }
   if (full_bos || !(create->flags & DRM_PANTHOR_BO_NO_MMAP))
      return real_ioctl(fd, DRM_IOCTL_PANTHOR_BO_CREATE, create);

   create->size = 4096;
   ret = real_ioctl(fd, DRM_IOCTL_PANTHOR_BO_CREATE, create);
   /* The kernel returns the page-aligned size it allocated. */
   create->size = (size + 4095) & ~4095ull;
   if (ret == 0) {
      pthread_mutex_lock(&lock);
      nommap_bytes += create->size;
      pthread_mutex_unlock(&lock);
   }
   return ret;
}

int
ioctl(int fd, unsigned long request, ...)
{
   va_list ap;
   void *arg;

   va_start(ap, request);
   arg = va_arg(ap, void *);
   va_end(ap);

   if (!real_ioctl)
      real_ioctl = (int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");

   if (request == DRM_IOCTL_PANTHOR_VM_BIND && arg)
      account(arg);

   if (request == DRM_IOCTL_PANTHOR_BO_CREATE && arg)
      return create_bo(fd, arg);

   return real_ioctl(fd, request, arg);
}

__attribute__((destructor)) static void
final_totals(void)
{
   pthread_mutex_lock(&lock);
   write_totals_locked();
   pthread_mutex_unlock(&lock);
}
