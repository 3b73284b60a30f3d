//! The vendor-neutral layer over a recording stand-in driver
//! ([`super::mock`]): what reaches the raw calls (and what does not) for
//! buffers, launches, graphs, the profile, errors and mapped pages.

use super::mock::*;
use super::*;

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

#[test]
fn mapped_pages_live_until_their_last_owner_and_mapping_go() {
    let d = open_paged(Some(64));
    let l = log();
    assert_eq!(d.page_size(), Some(64));
    let mut a = d.reserve_range(4, 0).unwrap();
    let mut b = d.reserve_range(2, 0).unwrap();
    assert_eq!(
        (a.slots(), a.page_bytes(), l.lock().unwrap().vas_live),
        (4, 64, 2)
    );
    let p = d.new_page().unwrap();
    a.map_run(1, vec![p.clone()]).unwrap();
    b.map_run(0, vec![p.clone()]).unwrap();
    // The same bytes through both ranges.
    d.htod(a.ptr() + 64 + 8, &[7u8, 9]).unwrap();
    let mut got = [0u8; 2];
    d.dtoh(&mut got, b.ptr() + 8).unwrap();
    assert_eq!(got, [7, 9]);
    assert!(
        a.map_run(1, vec![d.new_page().unwrap()]).is_err(),
        "a slot maps once"
    );
    assert!(
        a.map_run(3, vec![p.clone(); 2]).is_err(),
        "past the reservation"
    );
    // A run is mapped, then made accessible with one call.
    let grants = l.lock().unwrap().grants;
    a.map_run(2, vec![d.new_page().unwrap(), d.new_page().unwrap()])
        .unwrap();
    assert_eq!(l.lock().unwrap().grants, grants + 1);
    d.htod(a.ptr() + 2 * 64, &[1u8; 128]).unwrap();
    assert_eq!(a.page(1).unwrap().id(), p.id());
    drop(p);
    assert_eq!(l.lock().unwrap().pages_live, 3, "held by the ranges");
    // Unmapping waits for the work queued so far, once for all slots.
    let syncs = l.lock().unwrap().syncs;
    unsafe { a.unmap(0..4) };
    assert_eq!(l.lock().unwrap().syncs, syncs + 1);
    assert_eq!(
        l.lock().unwrap().order[syncs..],
        ["sync", "unmap", "unmap", "unmap"]
    );
    unsafe { a.unmap(0..4) };
    assert_eq!(
        l.lock().unwrap().syncs,
        syncs + 1,
        "nothing left to wait for"
    );
    assert!(a.page(1).is_none());
    // b still reads the page a let go.
    d.dtoh(&mut got, b.ptr() + 8).unwrap();
    assert_eq!(got, [7, 9]);
    drop(b);
    drop(a);
    let g = l.lock().unwrap();
    assert_eq!((g.vas_live, g.pages_live, g.maps, g.unmaps), (0, 0, 4, 4));
}

#[test]
fn without_page_mapping_nothing_is_reserved() {
    let d = open_paged(None);
    assert_eq!(d.page_size(), None);
    let e = d.reserve_range(1, 0).err().unwrap();
    assert_eq!(format!("{e}"), "mock has no virtual memory management");
    assert!(d.new_page().is_err());
}

#[test]
fn released_pages_are_kept_for_reuse_up_to_the_limit() {
    let d = open_paged(Some(64));
    let l = log();
    d.keep_pages(2 * 64);
    let pages: Vec<_> = (0..3).map(|_| d.new_page().unwrap()).collect();
    let ids: Vec<u64> = pages.iter().map(|p| p.id()).collect();
    let mut r = d.reserve_range(1, 0).unwrap();
    r.map_run(0, vec![pages[0].clone()]).unwrap();
    drop(pages);
    // The two unmapped ones kept; the mapped one still r's.
    assert_eq!(l.lock().unwrap().pages_live, 3);
    drop(r);
    // Past the limit: released once unmapped.
    assert_eq!(l.lock().unwrap().pages_live, 2);
    let again = [d.new_page().unwrap(), d.new_page().unwrap()];
    assert!(
        again.iter().all(|p| ids[1..].contains(&p.id())),
        "reused, not created"
    );
    assert_eq!(l.lock().unwrap().pages_live, 2);
    let fresh = d.new_page().unwrap();
    assert!(!ids[1..].contains(&fresh.id()));
    assert_eq!(l.lock().unwrap().pages_live, 3);
    drop((again, fresh));
    drop(d);
    assert_eq!(
        l.lock().unwrap().pages_live,
        0,
        "the pool releases what it kept"
    );
}

#[test]
fn a_dropped_range_is_parked_with_the_pages_only_it_maps() {
    let d = open_paged(Some(64));
    let l = log();
    d.keep_pages(8 * 64);
    let mut a = d.reserve_range(4, 0).unwrap();
    let pages: Vec<_> = (0..3).map(|_| d.new_page().unwrap()).collect();
    let ids: Vec<u64> = pages.iter().map(|p| p.id()).collect();
    a.map_run(0, pages).unwrap();
    // b maps a's third page too.
    let mut b = d.reserve_range(2, 0).unwrap();
    b.map_run(0, vec![a.page(2).unwrap().clone()]).unwrap();
    d.htod(a.ptr(), &[1u8, 2]).unwrap();
    d.htod(a.ptr() + 2 * 64, &[5u8]).unwrap();
    let ptr = a.ptr();
    drop(a);
    let (maps, unmaps) = {
        let g = l.lock().unwrap();
        assert_eq!((g.vas_live, g.pages_live), (2, 3), "nothing released");
        assert_eq!(g.unmaps, 1, "only the page b reads is unmapped");
        (g.maps, g.unmaps)
    };
    // Another size: new addresses.
    let c = d.reserve_range(3, 0).unwrap();
    assert_ne!(c.ptr(), ptr);
    // The same size: a's addresses, its own pages still mapped, no driver call.
    let a = d.reserve_range(4, 2).unwrap();
    assert_eq!(a.ptr(), ptr);
    assert_eq!(
        (0..4)
            .map(|i| a.page(i).map(|p| p.id()))
            .collect::<Vec<_>>(),
        [Some(ids[0]), Some(ids[1]), None, None]
    );
    let mut got = [0u8; 2];
    d.dtoh(&mut got, a.ptr()).unwrap();
    assert_eq!(got, [1, 2], "what the last owner left");
    let g = l.lock().unwrap();
    assert_eq!((g.maps, g.unmaps), (maps, unmaps), "no driver call");
    drop(g);
    d.dtoh(&mut got[..1], b.ptr()).unwrap();
    assert_eq!(got[0], 5, "b still reads its page");
    // Dropping the device gives back what is parked, then what is live.
    drop((a, c));
    assert_eq!(l.lock().unwrap().vas_live, 2, "a parked, c (no pages) not");
    drop(d);
    assert_eq!(l.lock().unwrap().vas_live, 1);
    drop(b);
    let g = l.lock().unwrap();
    assert_eq!((g.vas_live, g.pages_live), (0, 0));
}

#[test]
fn ranges_park_within_the_limit_and_are_taken_by_best_fit() {
    let d = open_paged(Some(64));
    let l = log();
    d.keep_pages(4 * 64);
    let mapped = |slots: usize, n: usize| {
        let mut r = d.reserve_range(slots, n).unwrap();
        r.map_run(0, (0..n).map(|_| d.new_page().unwrap()).collect())
            .unwrap();
        r
    };
    let (one, three) = (mapped(4, 1), mapped(4, 3));
    let (p1, p3) = (one.ptr(), three.ptr());
    drop((one, three));
    assert_eq!(l.lock().unwrap().vas_live, 2, "4 pages: both parked");
    // The fewest pages at or above the want, else the most below it.
    let r = d.reserve_range(4, 2).unwrap();
    assert_eq!((r.ptr(), r.mapped()), (p3, 3));
    drop(r);
    let r = d.reserve_range(4, 1).unwrap();
    assert_eq!((r.ptr(), r.mapped()), (p1, 1));
    let s = d.reserve_range(4, 4).unwrap();
    assert_eq!((s.ptr(), s.mapped()), (p3, 3));
    drop((r, s));
    // Past the limit a range is not parked: its pages go back.
    let five = mapped(8, 5);
    drop(five);
    let g = l.lock().unwrap();
    assert_eq!(
        (g.vas_live, g.pages_live),
        (2, 4),
        "the 5-page range gave its addresses and pages back"
    );
}
