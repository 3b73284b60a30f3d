//! A recording stand-in driver for tests of the device layer and of what is
//! built on it (the paged KV space): it logs what reaches the raw calls, and
//! keeps the bytes of its allocations and mapped pages, so copies through
//! mapped addresses land in the pages behind them.

use super::*;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;

#[derive(Default)]
pub(crate) struct Log {
    pub mallocs: Vec<usize>,
    pub frees: Vec<u64>,
    pub memsets: Vec<(u64, usize)>,
    pub copies: usize,
    /// (function, launch, pdl, first argument read as u64)
    pub launches: Vec<(usize, Launch, bool, u64)>,
    pub smem_optins: Vec<(usize, u32)>,
    pub syncs: usize,
    pub events_live: i64,
    pub graphs_live: i64,
    pub gemms: usize,
    pub dropped: bool,
    /// Live reserved address ranges and physical pages, pages mapped and
    /// unmapped so far.
    pub vas_live: i64,
    pub pages_live: i64,
    pub maps: usize,
    pub grants: usize,
    pub unmaps: usize,
    /// "sync" and "unmap", in the order they reached the driver.
    pub order: Vec<&'static str>,
}

#[derive(Clone, Default)]
pub(crate) struct Config {
    pub info: DeviceInfo,
    pub missing: Option<&'static str>,
    pub malloc_fails: bool,
    /// The page size of the mapping calls (`None`: the driver has none).
    pub page: Option<usize>,
}

thread_local! {
    pub(crate) static CONFIG: RefCell<Config> = RefCell::default();
    static LOG: RefCell<Option<Arc<Mutex<Log>>>> = const { RefCell::new(None) };
}

pub(crate) fn log() -> Arc<Mutex<Log>> {
    LOG.with(|l| l.borrow().clone().unwrap())
}

pub(crate) struct Mock {
    log: Arc<Mutex<Log>>,
    cfg: Config,
    next: Mutex<u64>,
    mem: Mutex<Mem>,
}

/// The device's bytes: allocations, reserved ranges, pages and where they are mapped.
#[derive(Default)]
struct Mem {
    next_addr: u64,
    /// By base address: an allocation's bytes, or a reserved range's length.
    regions: BTreeMap<u64, Region>,
    pages: HashMap<u64, Vec<u8>>,
    /// Pages released by their owner, kept while still mapped.
    released: Vec<u64>,
    mapped: BTreeMap<u64, u64>,
    /// Mapped addresses granted access.
    accessible: std::collections::HashSet<u64>,
}

enum Region {
    Buf(Vec<u8>),
    Va(usize),
}

impl Mem {
    fn take_addr(&mut self, bytes: usize, align: u64) -> u64 {
        let at = self.next_addr.max(1 << 20).next_multiple_of(align);
        self.next_addr = at + bytes as u64;
        at
    }

    /// The byte at `addr`: in the page mapped there, or in an allocation;
    /// `None` outside anything the device knows (addresses tests make up).
    /// An address reserved but unmapped is a fault, as on the device.
    fn byte(&mut self, addr: u64, page: usize) -> Option<&mut u8> {
        if let Some((&va, &h)) = self.mapped.range(..=addr).next_back()
            && addr < va + page as u64
        {
            assert!(
                self.accessible.contains(&va),
                "device access to {addr:#x} before its access grant"
            );
            return self.pages.get_mut(&h).map(|p| &mut p[(addr - va) as usize]);
        }
        let (&base, region) = self.regions.range_mut(..=addr).next_back()?;
        match region {
            Region::Buf(b) => b.get_mut((addr - base) as usize),
            Region::Va(len) if addr < base + *len as u64 => {
                panic!("device access to unmapped address {addr:#x}")
            }
            Region::Va(_) => None,
        }
    }

    fn read(&mut self, addr: u64, out: &mut [u8], page: usize) {
        for (i, o) in out.iter_mut().enumerate() {
            if let Some(b) = self.byte(addr + i as u64, page) {
                *o = *b;
            }
        }
    }

    fn write(&mut self, addr: u64, data: &[u8], page: usize) {
        for (i, d) in data.iter().enumerate() {
            if let Some(b) = self.byte(addr + i as u64, page) {
                *b = *d;
            }
        }
    }
}

impl Mock {
    fn bump(&self) -> u64 {
        let mut n = self.next.lock().unwrap();
        *n += 1;
        *n
    }

    fn page(&self) -> usize {
        self.cfg.page.unwrap_or(1)
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.log.lock().unwrap().dropped = true;
    }
}

const NAMES: &[&str] = &["k0", "k1", "k2"];

unsafe impl RawDevice for Mock {
    type Module = &'static str;
    type Function = usize;
    type Event = u64;
    type Graph = u64;
    const VENDOR: &'static str = "MOCK";
    const GEMM_LABEL: &'static str = "mock_gemm";
    const IMAGES: &'static [(&'static str, &'static [u8])] = &[("a", b"image a"), ("b", b"b")];

    fn open() -> anyhow::Result<(Self, DeviceInfo)> {
        let cfg = CONFIG.with(|c| c.borrow().clone());
        let log = Arc::new(Mutex::new(Log::default()));
        LOG.with(|l| *l.borrow_mut() = Some(log.clone()));
        let info = cfg.info.clone();
        Ok((
            Mock {
                log,
                cfg,
                next: Mutex::new(0x1000),
                mem: Mutex::default(),
            },
            info,
        ))
    }
    fn bind(&self) -> RawResult<()> {
        Ok(())
    }
    fn mem_info(&self) -> RawResult<(usize, usize)> {
        Err(RawError("no".into()))
    }
    fn malloc(&self, bytes: usize) -> RawResult<u64> {
        if self.cfg.malloc_fails {
            return Err(RawError("out of mock memory".into()));
        }
        self.log.lock().unwrap().mallocs.push(bytes);
        let mut m = self.mem.lock().unwrap();
        let at = m.take_addr(bytes, 256);
        m.regions.insert(at, Region::Buf(vec![0; bytes]));
        Ok(at)
    }
    unsafe fn free(&self, ptr: u64) {
        self.log.lock().unwrap().frees.push(ptr);
        self.mem.lock().unwrap().regions.remove(&ptr);
    }
    fn host_malloc(&self, bytes: usize) -> RawResult<*mut u8> {
        Ok(Box::into_raw(vec![0u8; bytes].into_boxed_slice()).cast())
    }
    unsafe fn host_free(&self, _ptr: *mut c_void) {}
    unsafe fn memset_zero(&self, ptr: u64, bytes: usize) -> RawResult<()> {
        self.log.lock().unwrap().memsets.push((ptr, bytes));
        let page = self.page();
        self.mem.lock().unwrap().write(ptr, &vec![0; bytes], page);
        Ok(())
    }
    unsafe fn htod(&self, dst: u64, src: *const c_void, bytes: usize) -> RawResult<()> {
        self.log.lock().unwrap().copies += 1;
        // SAFETY: the caller's contract: `src` is readable for `bytes`.
        let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), bytes) };
        let page = self.page();
        self.mem.lock().unwrap().write(dst, data, page);
        Ok(())
    }
    unsafe fn dtoh(&self, dst: *mut c_void, src: u64, bytes: usize) -> RawResult<()> {
        self.log.lock().unwrap().copies += 1;
        // SAFETY: the caller's contract: `dst` is writable for `bytes`.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), bytes) };
        let page = self.page();
        self.mem.lock().unwrap().read(src, out, page);
        Ok(())
    }
    unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> RawResult<()> {
        self.log.lock().unwrap().copies += 1;
        let page = self.page();
        let mut m = self.mem.lock().unwrap();
        let mut tmp = vec![0; bytes];
        m.read(src, &mut tmp, page);
        m.write(dst, &tmp, page);
        Ok(())
    }
    fn sync(&self) -> RawResult<()> {
        let mut l = self.log.lock().unwrap();
        l.syncs += 1;
        l.order.push("sync");
        Ok(())
    }
    fn page_size(&self) -> Option<usize> {
        self.cfg.page
    }
    fn va_reserve(&self, bytes: usize) -> RawResult<u64> {
        let page = self.cfg.page.expect("reserving without pages");
        assert_eq!(bytes % page, 0, "reservations are whole pages");
        let mut m = self.mem.lock().unwrap();
        let at = m.take_addr(bytes, page as u64);
        m.regions.insert(at, Region::Va(bytes));
        self.log.lock().unwrap().vas_live += 1;
        Ok(at)
    }
    unsafe fn va_free(&self, ptr: u64, bytes: usize) {
        if std::thread::panicking() {
            return; // a failed test's drops: its first panic tells
        }
        let mut m = self.mem.lock().unwrap();
        assert!(
            matches!(m.regions.remove(&ptr), Some(Region::Va(b)) if b == bytes),
            "freeing addresses that were not reserved so"
        );
        assert!(
            m.mapped.range(ptr..ptr + bytes as u64).next().is_none(),
            "freeing addresses with pages still mapped"
        );
        self.log.lock().unwrap().vas_live -= 1;
    }
    fn page_create(&self) -> RawResult<u64> {
        if self.cfg.page.is_none() {
            return Err(RawError("no virtual memory management".into()));
        }
        if self.cfg.malloc_fails {
            return Err(RawError("out of mock memory".into()));
        }
        let h = self.bump();
        // Undefined contents, as on the device.
        self.mem
            .lock()
            .unwrap()
            .pages
            .insert(h, vec![0xa5; self.page()]);
        self.log.lock().unwrap().pages_live += 1;
        Ok(h)
    }
    unsafe fn page_release(&self, page: u64) {
        if std::thread::panicking() {
            return; // a failed test's drops: its first panic tells
        }
        let mut m = self.mem.lock().unwrap();
        assert!(
            m.pages.contains_key(&page) && !m.released.contains(&page),
            "double release"
        );
        if m.mapped.values().any(|&h| h == page) {
            m.released.push(page);
        } else {
            m.pages.remove(&page);
        }
        self.log.lock().unwrap().pages_live -= 1;
    }
    unsafe fn map(&self, va: u64, page: u64) -> RawResult<()> {
        let size = self.page() as u64;
        let mut m = self.mem.lock().unwrap();
        let (&base, region) = m
            .regions
            .range(..=va)
            .next_back()
            .expect("a reserved range");
        assert!(
            matches!(region, Region::Va(len) if va + size <= base + *len as u64),
            "mapping outside a reserved range"
        );
        assert_eq!((va - base) % size, 0, "unaligned mapping");
        assert!(
            m.pages.contains_key(&page) && !m.released.contains(&page),
            "mapping a released page"
        );
        assert!(
            m.mapped.insert(va, page).is_none(),
            "mapping over a mapping"
        );
        self.log.lock().unwrap().maps += 1;
        Ok(())
    }
    unsafe fn grant_access(&self, va: u64, bytes: usize) -> RawResult<()> {
        let size = self.page();
        let mut m = self.mem.lock().unwrap();
        for at in (va..va + bytes as u64).step_by(size) {
            assert!(m.mapped.contains_key(&at), "access to an unmapped page");
            m.accessible.insert(at);
        }
        self.log.lock().unwrap().grants += 1;
        Ok(())
    }
    unsafe fn unmap(&self, va: u64) {
        if std::thread::panicking() {
            return; // a failed test's drops: its first panic tells
        }
        let mut m = self.mem.lock().unwrap();
        let h = m.mapped.remove(&va).expect("unmapping what is not mapped");
        m.accessible.remove(&va);
        if m.released.contains(&h) && !m.mapped.values().any(|&x| x == h) {
            m.released.retain(|&x| x != h);
            m.pages.remove(&h);
        }
        let mut l = self.log.lock().unwrap();
        l.unmaps += 1;
        l.order.push("unmap");
    }
    fn load_module(&self, image: &[u8]) -> RawResult<&'static str> {
        // The layer hands over 8-byte aligned copies.
        assert_eq!(image.as_ptr() as usize % 8, 0);
        Ok(if image == b"image a" { "a" } else { "b" })
    }
    fn function(&self, _m: &&'static str, name: &CStr) -> RawResult<usize> {
        let name = name.to_str().unwrap();
        if self.cfg.missing == Some(name) {
            return Err(RawError("NOT_FOUND".into()));
        }
        Ok(NAMES.iter().position(|n| *n == name).unwrap())
    }
    fn allow_smem(&self, f: usize, smem: u32) {
        self.log.lock().unwrap().smem_optins.push((f, smem));
    }
    fn occupancy(&self, f: usize, _block: u32, _smem: u32) -> Option<u32> {
        [Some(3), Some(0), None][f]
    }
    unsafe fn launch(
        &self,
        f: usize,
        l: &Launch,
        pdl: bool,
        args: &[*const c_void],
    ) -> RawResult<()> {
        let first = unsafe { *(args[0] as *const u64) };
        self.log.lock().unwrap().launches.push((f, *l, pdl, first));
        Ok(())
    }
    fn event_create(&self) -> RawResult<u64> {
        self.log.lock().unwrap().events_live += 1;
        Ok(self.bump())
    }
    fn event_record(&self, _e: u64) {}
    fn event_elapsed(&self, start: u64, end: u64) -> f32 {
        (end - start) as f32
    }
    fn event_destroy(&self, _e: u64) {
        self.log.lock().unwrap().events_live -= 1;
    }
    fn begin_capture(&self) -> RawResult<()> {
        Ok(())
    }
    fn end_capture(&self) -> RawResult<u64> {
        self.log.lock().unwrap().graphs_live += 1;
        Ok(self.bump())
    }
    fn graph_launch(&self, _g: &u64) -> RawResult<()> {
        Ok(())
    }
    fn graph_destroy(&self, _g: &mut u64) {
        self.log.lock().unwrap().graphs_live -= 1;
    }
    unsafe fn gemm_bf16(
        &self,
        _: u64,
        _: u64,
        _: u64,
        _: i32,
        _: i32,
        _: i32,
        _: bool,
    ) -> RawResult<()> {
        self.log.lock().unwrap().gemms += 1;
        Ok(())
    }
}

pub(crate) const K: [Kernel; 3] = [
    Kernel::new(0, "k0", "a"),
    Kernel::new(1, "k1", "b"),
    Kernel::new(2, "k2", "a"),
];

pub(crate) const OPTS: DeviceOptions = DeviceOptions {
    debug: false,
    profile: false,
    pdl: true,
};

pub(crate) fn open(info: DeviceInfo, opts: DeviceOptions) -> Device<Mock> {
    CONFIG.with(|c| {
        *c.borrow_mut() = Config {
            info,
            ..Config::default()
        }
    });
    Device::open(&K, opts).unwrap()
}

/// A device whose driver maps pages of `page` bytes (or none).
pub(crate) fn open_paged(page: Option<usize>) -> Device<Mock> {
    CONFIG.with(|c| {
        *c.borrow_mut() = Config {
            info: hopper(),
            page,
            ..Config::default()
        }
    });
    Device::open(&K, OPTS).unwrap()
}

pub(crate) fn hopper() -> DeviceInfo {
    DeviceInfo {
        name: "mock".into(),
        sm_count: 0,
        max_smem: 100_000,
        pdl: true,
        ..DeviceInfo::default()
    }
}

/// Launches `k` with one pointer and one int argument.
pub(crate) fn go(d: &Device<Mock>, k: Kernel, l: Launch) -> Result<()> {
    let (a, b) = (DevPtr(0xabc), 7i32);
    let args = [
        &a as *const DevPtr as *const c_void,
        &b as *const i32 as *const c_void,
    ];
    unsafe { d.launch_raw(k, l, &args) }
}
