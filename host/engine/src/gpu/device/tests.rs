//! The vendor-neutral layer over a recording stand-in driver: what reaches
//! the raw calls (and what does not) for buffers, launches, graphs, the
//! profile and errors.

use super::*;
use std::cell::RefCell;
use std::ffi::CStr;

#[derive(Default)]
struct Log {
    mallocs: Vec<usize>,
    frees: Vec<u64>,
    memsets: Vec<(u64, usize)>,
    copies: usize,
    /// (function, launch, pdl, first argument read as u64)
    launches: Vec<(usize, Launch, bool, u64)>,
    smem_optins: Vec<(usize, u32)>,
    syncs: usize,
    events_live: i64,
    graphs_live: i64,
    gemms: usize,
    dropped: bool,
}

#[derive(Clone, Default)]
struct Config {
    info: DeviceInfo,
    missing: Option<&'static str>,
    malloc_fails: bool,
}

thread_local! {
    static CONFIG: RefCell<Config> = RefCell::default();
    static LOG: RefCell<Option<Arc<Mutex<Log>>>> = const { RefCell::new(None) };
}

fn log() -> Arc<Mutex<Log>> {
    LOG.with(|l| l.borrow().clone().unwrap())
}

struct Mock {
    log: Arc<Mutex<Log>>,
    cfg: Config,
    next: Mutex<u64>,
}

impl Mock {
    fn bump(&self) -> u64 {
        let mut n = self.next.lock().unwrap();
        *n += 1;
        *n
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
        Ok(self.bump() << 8)
    }
    unsafe fn free(&self, ptr: u64) {
        self.log.lock().unwrap().frees.push(ptr);
    }
    fn host_malloc(&self, bytes: usize) -> RawResult<*mut u8> {
        Ok(Box::into_raw(vec![0u8; bytes].into_boxed_slice()).cast())
    }
    unsafe fn host_free(&self, _ptr: *mut c_void) {}
    unsafe fn memset_zero(&self, ptr: u64, bytes: usize) -> RawResult<()> {
        self.log.lock().unwrap().memsets.push((ptr, bytes));
        Ok(())
    }
    unsafe fn htod(&self, _dst: u64, _src: *const c_void, _bytes: usize) -> RawResult<()> {
        self.log.lock().unwrap().copies += 1;
        Ok(())
    }
    unsafe fn dtoh(&self, _dst: *mut c_void, _src: u64, _bytes: usize) -> RawResult<()> {
        self.log.lock().unwrap().copies += 1;
        Ok(())
    }
    unsafe fn dtod(&self, _dst: u64, _src: u64, _bytes: usize) -> RawResult<()> {
        self.log.lock().unwrap().copies += 1;
        Ok(())
    }
    fn sync(&self) -> RawResult<()> {
        self.log.lock().unwrap().syncs += 1;
        Ok(())
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

const K: [Kernel; 3] = [
    Kernel::new(0, "k0", "a"),
    Kernel::new(1, "k1", "b"),
    Kernel::new(2, "k2", "a"),
];

const OPTS: DeviceOptions = DeviceOptions {
    debug: false,
    profile: false,
    pdl: true,
};

fn open(info: DeviceInfo, opts: DeviceOptions) -> Device<Mock> {
    CONFIG.with(|c| {
        *c.borrow_mut() = Config {
            info,
            ..Config::default()
        }
    });
    Device::open(&K, opts).unwrap()
}

fn hopper() -> DeviceInfo {
    DeviceInfo {
        name: "mock".into(),
        sm_count: 0,
        max_smem: 100_000,
        pdl: true,
        ..DeviceInfo::default()
    }
}

/// Launches `k` with one pointer and one int argument.
fn go(d: &Device<Mock>, k: Kernel, l: Launch) -> Result<()> {
    let (a, b) = (DevPtr(0xabc), 7i32);
    let args = [
        &a as *const DevPtr as *const c_void,
        &b as *const i32 as *const c_void,
    ];
    unsafe { d.launch_raw(k, l, &args) }
}

#[test]
fn buffers_are_freed_on_drop_and_keep_the_driver() {
    let d = open(hopper(), OPTS);
    assert_eq!(d.sm_count, 1, "at least one multiprocessor");
    let b = d.alloc_zeroed(10).unwrap();
    let l = log();
    assert_eq!(
        l.lock().unwrap().mallocs,
        [16],
        "small allocations round up to 16 bytes"
    );
    assert_eq!(l.lock().unwrap().memsets, [(b.ptr(), 16)]);
    assert_eq!((b.bytes(), b.at(4)), (10, b.ptr() + 4));
    let ptr = b.ptr();
    d.htod::<f32>(ptr, &[]).unwrap();
    d.dtoh::<f32>(&mut [], ptr).unwrap();
    d.dtod(ptr, ptr, 0).unwrap();
    assert_eq!(l.lock().unwrap().copies, 0, "empty copies reach no driver");
    d.htod(ptr, &[1f32]).unwrap();
    assert_eq!(l.lock().unwrap().copies, 1);
    drop(d);
    assert!(!l.lock().unwrap().dropped, "a live buffer keeps the driver");
    drop(b);
    assert_eq!(l.lock().unwrap().frees, [ptr]);
    assert!(l.lock().unwrap().dropped);
}

#[test]
fn launch_policy() {
    let d = open(hopper(), OPTS);
    let l = log();
    // Empty grids launch nothing.
    go(&d, K[1], Launch::new((0, 1, 1), (32, 1, 1), 0)).unwrap();
    assert!(l.lock().unwrap().launches.is_empty());
    go(&d, K[1], Launch::pdl((2, 1, 1), (32, 1, 1), 64)).unwrap();
    go(&d, K[2], Launch::new((1, 1, 1), (32, 1, 1), 0)).unwrap();
    {
        let g = l.lock().unwrap();
        assert_eq!(
            g.launches[0],
            (1, Launch::pdl((2, 1, 1), (32, 1, 1), 64), true, 0xabc)
        );
        assert!(!g.launches[1].2, "PDL only when asked for");
        assert_eq!(g.smem_optins, [(1, 64), (2, 0)]);
        assert_eq!(g.syncs, 0);
    }
    let e = go(&d, K[0], Launch::new((1, 1, 1), (32, 1, 1), 100_001)).unwrap_err();
    assert!(
        format!("{e}").contains("kernel k0 needs 100001 bytes"),
        "{e}"
    );
    assert_eq!(l.lock().unwrap().launches.len(), 2);
    assert_eq!(d.occupancy(K[0], 256, 0), 3);
    assert_eq!(d.occupancy(K[1], 256, 0), 1, "at least one block");
    assert_eq!(d.occupancy(K[2], 256, 0), 1, "unknown: one block");

    // No PDL on a device without it, with it switched off, or while
    // debugging (which also synchronises after every launch).
    for (info, opts) in [
        (
            DeviceInfo {
                pdl: false,
                ..hopper()
            },
            OPTS,
        ),
        (hopper(), DeviceOptions { pdl: false, ..OPTS }),
        (
            hopper(),
            DeviceOptions {
                debug: true,
                ..OPTS
            },
        ),
    ] {
        let d = open(info, opts);
        go(&d, K[0], Launch::pdl((1, 1, 1), (32, 1, 1), 0)).unwrap();
        let g = log();
        let g = g.lock().unwrap();
        assert!(!g.launches[0].2);
        assert_eq!(g.syncs, usize::from(opts.debug));
    }
    // Unknown shared-memory limit: anything launches.
    let d = open(
        DeviceInfo {
            max_smem: 0,
            ..hopper()
        },
        OPTS,
    );
    assert_eq!(d.max_shared_per_block(), usize::MAX);
    go(&d, K[0], Launch::new((1, 1, 1), (32, 1, 1), 1 << 20)).unwrap();
}

#[test]
fn profile_names_launches_and_gemms() {
    let d = open(
        hopper(),
        DeviceOptions {
            profile: true,
            ..OPTS
        },
    );
    assert!(d.profiling());
    for _ in 0..2 {
        go(&d, K[0], Launch::pdl((1, 1, 1), (32, 1, 1), 0)).unwrap();
    }
    d.gemm_bf16(1, 2, 3, 4, 5, 6, false).unwrap();
    let l = log();
    assert!(
        l.lock().unwrap().launches.iter().all(|x| !x.2),
        "profiling serialises launches"
    );
    let p = d.take_profile();
    assert_eq!(
        p.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(),
        [("k0", 2), ("mock_gemm", 1)]
    );
    assert_eq!(p[0].2, 2.0, "both launches' event spans");
    assert_eq!(l.lock().unwrap().events_live, 0, "events destroyed");
    assert!(d.take_profile().is_empty(), "drained");
    assert!(open(hopper(), OPTS).take_profile().is_empty());
}

#[test]
fn graphs_are_destroyed_on_drop() {
    let d = open(
        hopper(),
        DeviceOptions {
            debug: true,
            ..OPTS
        },
    );
    d.begin_capture().unwrap();
    let g = d.end_capture().unwrap();
    d.launch_graph(&g).unwrap();
    let l = log();
    let (live, syncs) = {
        let g = l.lock().unwrap();
        (g.graphs_live, g.syncs)
    };
    assert_eq!(
        (live, syncs),
        (1, 1),
        "one graph, synchronised after its launch"
    );
    drop(g);
    assert_eq!(l.lock().unwrap().graphs_live, 0);
}

#[test]
fn errors_name_the_operation() {
    CONFIG.with(|c| {
        *c.borrow_mut() = Config {
            info: hopper(),
            missing: Some("k2"),
            ..Config::default()
        }
    });
    let e = Device::<Mock>::open(&K, OPTS).err().unwrap();
    assert_eq!(format!("{e}"), "kernel k2 in module a: NOT_FOUND");
    // A kernel whose module has no image.
    CONFIG.with(|c| c.borrow_mut().missing = None);
    let e = Device::<Mock>::open(&[K[0], K[1], Kernel::new(2, "k2", "gone")], OPTS)
        .err()
        .unwrap();
    assert_eq!(
        format!("{e}"),
        "kernel k2 not found in the embedded modules"
    );

    CONFIG.with(|c| c.borrow_mut().malloc_fails = true);
    let d = Device::<Mock>::open(&K, OPTS).unwrap();
    let e = d.alloc(1 << 40).err().unwrap();
    assert_eq!(
        format!("{e}"),
        "MOCK allocation of 1099511627776 bytes failed: out of mock memory"
    );
    assert_eq!(d.mem_info(), (0, 0));
    let e = d.gemm_bf16(1, 2, 3, 1 << 31, 5, 6, false).unwrap_err();
    assert!(
        format!("{e}").contains("dimension 2147483648 exceeds i32"),
        "{e}"
    );
    assert_eq!(log().lock().unwrap().gemms, 0);
}
