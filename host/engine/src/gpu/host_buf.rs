//! Page-locked host memory shared by the CUDA and HIP device layers.

/// Page-locked host memory from a device layer (`download_pinned`): the
/// device copies to and from it at the link's speed, where pageable memory
/// goes through the driver's staging buffer. Freed on drop by the layer's
/// `release`.
pub struct HostBuf {
    ptr: *mut u8,
    bytes: usize,
    release: Box<dyn Fn(*mut std::ffi::c_void) + Send + Sync>,
}

// Plain memory owned by this value; the driver only sees it again at drop.
unsafe impl Send for HostBuf {}
unsafe impl Sync for HostBuf {}

impl HostBuf {
    /// Owns `bytes` bytes at `ptr`, which the caller fills before anyone
    /// reads them.
    pub(super) fn new(
        ptr: *mut u8,
        bytes: usize,
        release: impl Fn(*mut std::ffi::c_void) + Send + Sync + 'static,
    ) -> Self {
        HostBuf {
            ptr,
            bytes,
            release: Box::new(release),
        }
    }
}

impl std::ops::Deref for HostBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        (self.release)(self.ptr.cast());
    }
}
