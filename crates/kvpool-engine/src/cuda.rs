//! Registered memory on a GPU. SGLang and vLLM register their KV caches,
//! which are CUDA device memory: the CPU cannot load or store those
//! addresses, and neither can `process_vm_readv` or a socket's `recv`. So
//! every byte to or from them is staged through host memory with the CUDA
//! driver's copies, as Mooncake's TCP transport does with `cudaMemcpy`.
//!
//! The driver is found, never loaded: `libcuda.so.1` is looked up among
//! the libraries the process already has (`RTLD_NOLOAD`), and nothing here
//! initializes it. A process that never loaded the driver holds no device
//! memory; loading and initializing it here would give a CPU-only process
//! a driver context and break CUDA in children it forks afterwards.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use kvpool_proto::{Code, KvError, KvResult};

/// Where registered memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Host memory: the CPU and the kernel reach it directly.
    Host,
    /// GPU memory: reached only through the driver's copies.
    Device(Device),
}

/// GPU memory of one CUDA context, which the driver's copies run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    /// The `CUcontext`, an opaque pointer the driver hands out.
    context: usize,
}

impl Memory {
    /// Where `[addr, addr + len)` lives (`len > 0`): on a GPU when the
    /// process's CUDA driver says its first and last bytes are device
    /// memory of one context; refused when only one end is.
    pub fn locate(addr: u64, len: u64) -> KvResult<Memory> {
        let Some(driver) = Driver::get() else {
            return Ok(Memory::Host);
        };
        let last = addr.saturating_add(len.max(1) - 1);
        match (driver.context_of(addr), driver.context_of(last)) {
            (None, None) => Ok(Memory::Host),
            (Some(a), Some(b)) if a == b => Ok(Memory::Device(Device { context: a })),
            _ => Err(KvError::new(
                Code::InvalidParams,
                format!("{addr:#x}+{len} is partly GPU memory: register one allocation at a time"),
            )),
        }
    }

    /// The device, for GPU memory.
    pub fn device(self) -> Option<Device> {
        match self {
            Memory::Host => None,
            Memory::Device(d) => Some(d),
        }
    }
}

impl Device {
    /// Copies `dst.len()` bytes of device memory at `src` into `dst`.
    pub fn download(self, dst: &mut [u8], src: u64) -> KvResult<()> {
        let len = dst.len();
        let about = || format!("copy of {len} bytes at {src:#x}");
        self.in_context(about, |d| {
            // SAFETY: `dst` is writable for its length; the driver checks
            // `src` and answers an error for memory it does not own.
            unsafe { (d.download)(dst.as_mut_ptr().cast(), src, len) }
        })
    }

    /// Copies `src` into device memory at `dst`, landed when it returns.
    pub fn upload(self, dst: u64, src: &[u8]) -> KvResult<()> {
        let about = || format!("copy of {} bytes to {dst:#x}", src.len());
        self.in_context(about, |d| {
            // SAFETY: `src` is readable for its length; the driver checks
            // `dst` as above.
            match unsafe { (d.upload)(dst, src.as_ptr().cast(), src.len()) } {
                // From pageable memory the copy may return before its DMA
                // is done, and a peer told the bytes landed may hand them
                // to kernels on a stream that does not wait for this one.
                // SAFETY: the legacy default stream of the pushed context.
                0 => unsafe { (d.synchronize)(std::ptr::null_mut()) },
                r => r,
            }
        })
    }

    /// Runs `call` with this device's context current on the calling
    /// thread, and the thread's own context (a caller's, when the engine
    /// runs on it) current again afterwards.
    fn in_context(
        self,
        about: impl Fn() -> String,
        call: impl FnOnce(&Driver) -> CuResult,
    ) -> KvResult<()> {
        let Some(d) = Driver::get() else {
            return Err(failed(about(), -1));
        };
        // SAFETY: a context the driver handed out for this memory.
        let pushed = unsafe { (d.push)(self.context as *mut c_void) };
        if pushed != 0 {
            return Err(failed(format!("{} (cuCtxPushCurrent)", about()), pushed));
        }
        let done = call(d);
        let mut popped = std::ptr::null_mut();
        // SAFETY: pops the context pushed above.
        unsafe { (d.pop)(&mut popped) };
        checked(done, about)
    }
}

/// Waits until the work queued on CUDA stream `stream` (a `CUstream`; 0 is
/// the legacy default stream) is done: in `device`'s context when given,
/// else in the calling thread's current one. A process without the driver
/// has no streams, and nothing to wait for.
pub fn wait_for_stream(stream: u64, device: Option<Device>) -> KvResult<()> {
    let Some(d) = Driver::get() else {
        return Ok(());
    };
    // SAFETY: the caller names a stream of its own (or 0).
    let sync = |d: &Driver| unsafe { (d.synchronize)(stream as usize as *mut c_void) };
    let about = || format!("wait for stream {stream:#x}");
    match device {
        Some(device) => device.in_context(about, sync),
        None => checked(sync(d), about),
    }
}

/// `Ok` for a driver call that succeeded, else its error.
fn checked(r: CuResult, about: impl Fn() -> String) -> KvResult<()> {
    match r {
        0 => Ok(()),
        r => Err(failed(about(), r)),
    }
}

/// The error of a driver call that failed.
fn failed(what: String, r: CuResult) -> KvError {
    KvError::new(
        Code::TransferFail,
        format!("CUDA {what} failed (CUresult {r})"),
    )
}

/// `CUresult`: 0 is success.
type CuResult = c_int;

/// `cuPointerGetAttribute(void *data, CUpointer_attribute, CUdeviceptr)`.
type AttributeFn = unsafe extern "C" fn(*mut c_void, c_int, u64) -> CuResult;
/// `cuDevicePrimaryCtxRetain(CUcontext *, CUdevice)`.
type PrimaryFn = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult;
/// `cuCtxPushCurrent_v2(CUcontext)`.
type PushFn = unsafe extern "C" fn(*mut c_void) -> CuResult;
/// `cuCtxPopCurrent_v2(CUcontext *)`.
type PopFn = unsafe extern "C" fn(*mut *mut c_void) -> CuResult;
/// `cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t)`.
type DownloadFn = unsafe extern "C" fn(*mut c_void, u64, usize) -> CuResult;
/// `cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t)`.
type UploadFn = unsafe extern "C" fn(u64, *const c_void, usize) -> CuResult;
/// `cuStreamSynchronize(CUstream)`.
type SynchronizeFn = unsafe extern "C" fn(*mut c_void) -> CuResult;

/// The driver entry points used here, with `cuda.h`'s signatures.
struct Driver {
    attribute: AttributeFn,
    primary: PrimaryFn,
    push: PushFn,
    pop: PopFn,
    download: DownloadFn,
    upload: UploadFn,
    synchronize: SynchronizeFn,
}

/// `CU_POINTER_ATTRIBUTE_CONTEXT`.
const ATTRIBUTE_CONTEXT: c_int = 1;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
const ATTRIBUTE_MEMORY_TYPE: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_IS_MANAGED`.
const ATTRIBUTE_IS_MANAGED: c_int = 8;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
const ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_DEVICE: c_uint = 2;

impl Driver {
    /// The process's driver, once it has one loaded. Not found is not
    /// remembered: a framework may load it after the first registration.
    fn get() -> Option<&'static Driver> {
        static DRIVER: OnceLock<Driver> = OnceLock::new();
        if let Some(d) = DRIVER.get() {
            return Some(d);
        }
        let found = Driver::find()?;
        Some(DRIVER.get_or_init(|| found))
    }

    /// Looks the entry points up in an already loaded `libcuda.so.1`.
    fn find() -> Option<Driver> {
        // SAFETY: with RTLD_NOLOAD, dlopen loads nothing and only finds a
        // library already in the process; the handle is never closed, so
        // the functions stay valid for the process's life.
        let lib =
            unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if lib.is_null() {
            return None;
        }
        let sym = |name: &CStr| {
            // SAFETY: a lookup in a live handle.
            let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        // SAFETY: each symbol is the driver API function of that name,
        // whose C signature the field's type spells.
        unsafe {
            use std::mem::transmute;
            Some(Driver {
                attribute: transmute::<*mut c_void, AttributeFn>(sym(c"cuPointerGetAttribute")?),
                primary: transmute::<*mut c_void, PrimaryFn>(sym(c"cuDevicePrimaryCtxRetain")?),
                push: transmute::<*mut c_void, PushFn>(sym(c"cuCtxPushCurrent_v2")?),
                pop: transmute::<*mut c_void, PopFn>(sym(c"cuCtxPopCurrent_v2")?),
                download: transmute::<*mut c_void, DownloadFn>(sym(c"cuMemcpyDtoH_v2")?),
                upload: transmute::<*mut c_void, UploadFn>(sym(c"cuMemcpyHtoD_v2")?),
                synchronize: transmute::<*mut c_void, SynchronizeFn>(sym(c"cuStreamSynchronize")?),
            })
        }
    }

    /// The context of the device memory at `addr`; `None` for memory the
    /// CPU can reach (host memory, pinned or not, and managed memory).
    fn context_of(&self, addr: u64) -> Option<usize> {
        let kind: c_uint = self.attr(ATTRIBUTE_MEMORY_TYPE, addr)?;
        let managed: c_uint = self.attr(ATTRIBUTE_IS_MANAGED, addr).unwrap_or(0);
        if kind != MEMORYTYPE_DEVICE || managed != 0 {
            return None;
        }
        let context: usize = self.attr(ATTRIBUTE_CONTEXT, addr).unwrap_or(0);
        if context != 0 {
            return Some(context);
        }
        // Memory mapped with the virtual memory calls (PyTorch's expandable
        // segments) has no context of its own: its device's primary one.
        let ordinal: c_int = self.attr(ATTRIBUTE_DEVICE_ORDINAL, addr)?;
        let mut primary = std::ptr::null_mut();
        // SAFETY: writes one CUcontext; the retain is never released, so
        // the context outlives every registration that names it.
        let r = unsafe { (self.primary)(&mut primary, ordinal) };
        (r == 0 && !primary.is_null()).then_some(primary as usize)
    }

    /// One pointer attribute, `None` when the driver does not know `addr`.
    fn attr<T: Default>(&self, attribute: c_int, addr: u64) -> Option<T> {
        let mut out = T::default();
        // SAFETY: the attributes asked for are each written as a `T` here
        // (unsigned int, int, or a pointer-sized context).
        let r = unsafe { (self.attribute)((&mut out as *mut T).cast(), attribute, addr) };
        (r == 0).then_some(out)
    }
}
