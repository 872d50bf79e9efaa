//! tests/c/bad_args.c: bad arguments from C (NULL handle, NULL and short buffers, wrong plane count,
//! a slot that is not the next, unknown enum values, the device backend) come back as the documented
//! status codes and messages, and nothing moves; the matching good calls succeed.

use crate::common;

use common::Link;
use packs::random::{write_random, RandomShape};
use packs::QuantKind;

#[test]
fn bad_arguments_from_c_get_status_codes_and_messages_never_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("tiny.pack");
    write_random(&RandomShape::tiny(), QuantKind::F32, 5, &pack).unwrap();
    let not_a_pack = dir.path().join("not-a.pack");
    std::fs::write(
        &not_a_pack,
        b"this is not a pack, just some bytes long enough to read",
    )
    .unwrap();
    let exe = common::compile("bad_args.c", dir.path(), Link::Dynamic);
    let out = common::run(&exe, &[pack.as_os_str(), not_a_pack.as_os_str()]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    println!("{stdout}");
    let checks: usize = stdout
        .trim()
        .strip_prefix("ok ")
        .and_then(|s| s.strip_suffix(" checks"))
        .unwrap_or_else(|| panic!("bad_args printed {stdout:?}"))
        .parse()
        .unwrap();
    assert!(checks >= 85, "only {checks} checks ran");
}
