/*
 * A stand-in for the CUDA driver (libcuda.so.1) for the engine's tests on
 * machines without a GPU: the entry points kvpool's engine calls, with the
 * driver's signatures and error codes.
 *
 * "Device memory" is address space the CPU cannot touch (PROT_NONE), each
 * allocation backed by host memory that only the driver's copies below
 * reach. So a path that loads or stores a device address from the CPU, or
 * hands one to the kernel (process_vm_readv, recv), faults or fails as it
 * would with a GPU. Copies need the allocation's context pushed on the
 * calling thread, as the real driver does; and a copy from host to device
 * lands only at the next cuStreamSynchronize of the thread, as a real one
 * from pageable memory may still be on its way when the call returns.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_INVALID_CONTEXT 201
#define MAX_ALLOCS 256

struct alloc {
    uint64_t base;
    size_t len;
    unsigned char *backing;
};

static struct alloc allocs[MAX_ALLOCS];
static int nallocs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char the_context;
static __thread int pushed;
/* Host-to-device copies of this thread not landed yet. */
struct pending {
    uint64_t dst;
    void *bytes;
    size_t n;
};
static __thread struct pending in_flight[64];
static __thread int npending;
static unsigned long copies;
static unsigned long syncs;

static struct alloc *find(uint64_t p, size_t n) {
    struct alloc *found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nallocs; i++) {
        struct alloc *a = &allocs[i];
        if (p >= a->base && p - a->base <= a->len && n <= a->len - (p - a->base)) {
            found = a;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

/* Test helpers: allocate device memory, and read or write it without a
 * context (what a test checks, not what the engine may do). */
uint64_t fake_cuda_alloc(size_t len) {
    void *base = mmap(0, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *backing = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED || backing == MAP_FAILED)
        return 0;
    pthread_mutex_lock(&lock);
    if (nallocs == MAX_ALLOCS) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    allocs[nallocs++] = (struct alloc){(uint64_t)base, len, backing};
    pthread_mutex_unlock(&lock);
    return (uint64_t)base;
}

int fake_cuda_poke(uint64_t dst, const void *src, size_t n) {
    struct alloc *a = find(dst, n);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(a->backing + (dst - a->base), src, n);
    return CUDA_SUCCESS;
}

int fake_cuda_peek(void *dst, uint64_t src, size_t n) {
    struct alloc *a = find(src, n);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, a->backing + (src - a->base), n);
    return CUDA_SUCCESS;
}

unsigned long fake_cuda_copies(void) { return __atomic_load_n(&copies, __ATOMIC_SEQ_CST); }

unsigned long fake_cuda_syncs(void) { return __atomic_load_n(&syncs, __ATOMIC_SEQ_CST); }

/* The driver API. */
int cuPointerGetAttribute(void *data, int attribute, uint64_t ptr) {
    if (!find(ptr, 1))
        return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case 1: /* CU_POINTER_ATTRIBUTE_CONTEXT */
        *(void **)data = &the_context;
        return CUDA_SUCCESS;
    case 2: /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE: CU_MEMORYTYPE_DEVICE */
        *(unsigned *)data = 2;
        return CUDA_SUCCESS;
    case 8: /* CU_POINTER_ATTRIBUTE_IS_MANAGED */
        *(unsigned *)data = 0;
        return CUDA_SUCCESS;
    case 9: /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */
        *(int *)data = 0;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

int cuDevicePrimaryCtxRetain(void **ctx, int device) {
    if (device != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = &the_context;
    return CUDA_SUCCESS;
}

int cuCtxPushCurrent_v2(void *ctx) {
    if (ctx != &the_context)
        return CUDA_ERROR_INVALID_CONTEXT;
    pushed++;
    return CUDA_SUCCESS;
}

int cuCtxPopCurrent_v2(void **ctx) {
    if (pushed == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    pushed--;
    if (ctx)
        *ctx = &the_context;
    return CUDA_SUCCESS;
}

int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) {
    if (pushed == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (fake_cuda_peek(dst, src, n) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_add_fetch(&copies, 1, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}

int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) {
    if (pushed == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!find(dst, n) || npending == 64)
        return CUDA_ERROR_INVALID_VALUE;
    void *bytes = malloc(n ? n : 1);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(bytes, src, n);
    in_flight[npending++] = (struct pending){dst, bytes, n};
    __atomic_add_fetch(&copies, 1, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}

/* Any stream: the legacy one (0) needs a context current on the thread. */
int cuStreamSynchronize(void *stream) {
    if (pushed == 0 && stream == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = 0; i < npending; i++) {
        fake_cuda_poke(in_flight[i].dst, in_flight[i].bytes, in_flight[i].n);
        free(in_flight[i].bytes);
    }
    npending = 0;
    __atomic_add_fetch(&syncs, 1, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}
