//! The safetensors loader: every tensor whole, aligned and byte-identical
//! with the file, through every method; hostile headers refused clearly.

mod common;

use std::path::Path;

use iopath_heap::{
    dtype_align, load_safetensors, Dtype, Error, HugePages, LoadOptions, MemfdHeap, Method,
};

fn check_all(path: &Path, opts: &LoadOptions) -> usize {
    let file = std::fs::read(path).unwrap();
    let heap = MemfdHeap::new(HugePages::None);
    let t = load_safetensors(path, &heap, opts, &mut |_| {})
        .unwrap_or_else(|e| panic!("{:?}: {e}", opts.method));
    let st = safetensors::SafeTensors::deserialize(&file).unwrap();
    assert_eq!(t.tensors.len(), st.len());
    for (name, view) in st.iter() {
        let got = &t.tensors[name];
        assert_eq!(got.dtype, view.dtype(), "{name}");
        assert_eq!(got.shape, view.shape(), "{name}");
        assert_eq!(got.len, view.data().len(), "{name}");
        let addr = got.buffer.addr() + got.offset;
        assert_eq!(addr % dtype_align(got.dtype), 0, "{name} misaligned");
        let mut bytes = vec![0u8; got.len];
        got.buffer.read_at(got.offset, &mut bytes).unwrap();
        assert!(
            bytes == view.data(),
            "{name}: bytes differ ({:?})",
            opts.method
        );
    }
    assert_eq!(t.metadata.get("format").map(String::as_str), Some("pt"));
    assert_eq!(
        t.stats.bytes,
        st.iter().map(|(_, v)| v.data().len() as u64).sum::<u64>()
    );
    t.buffers.len()
}

fn mixed(path: &Path) {
    let d = |len: usize, seed: u64| common::pattern(len, seed);
    common::write_safetensors(
        path,
        &[
            // Aligned run of mixed dtypes.
            ("a.f32", "F32", vec![3, 5], d(60, 1)),
            ("b.f64", "F64", vec![7], d(56, 2)),
            ("c.i16", "I16", vec![9], d(18, 3)),
            // An odd byte count: the F32 after it is misaligned in the file.
            ("d.u8", "U8", vec![3], d(3, 4)),
            ("e.f32", "F32", vec![1000], d(4000, 5)),
            ("f.bf16", "BF16", vec![2, 3], d(12, 6)),
            // Larger than the buffer size: a buffer of its own.
            ("g.big", "F32", vec![300_000], d(1_200_000, 7)),
            ("h.empty", "F32", vec![0, 4], vec![]),
            ("i.bool", "BOOL", vec![5], d(5, 8)),
            ("j.i64", "I64", vec![33_000], d(264_000, 9)),
        ],
    );
}

#[test]
fn every_tensor_whole_aligned_and_identical_for_every_method() {
    for dir in [common::disk_dir(), common::shm_dir()]
        .into_iter()
        .flatten()
    {
        let path = dir.path().join("mixed.safetensors");
        mixed(&path);
        for method in Method::ALL {
            let opts = LoadOptions {
                buffer_size: 256 << 10,
                method,
                ..LoadOptions::default()
            };
            let buffers = check_all(&path, &opts);
            assert!(buffers >= 3, "the big tensor has its own buffer: {buffers}");
        }
        // Default buffer size: everything but nothing larger than the file.
        check_all(&path, &LoadOptions::default());
    }
}

#[test]
fn files_written_by_the_safetensors_crate_load() {
    let Some(dir) = common::disk_dir() else {
        return;
    };
    let path = dir.path().join("w.safetensors");
    let datas: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = (0..50)
        .map(|i| {
            let (dtype, size) = [
                (Dtype::F32, 4),
                (Dtype::F16, 2),
                (Dtype::U8, 1),
                (Dtype::I64, 8),
            ][i % 4];
            let n = 1 + i * 37;
            (
                format!("t{i}"),
                dtype,
                vec![n],
                common::pattern(n * size, i as u64),
            )
        })
        .collect();
    let views: Vec<_> = datas
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    safetensors::serialize_to_file(views, Some(meta), &path).unwrap();
    check_all(
        &path,
        &LoadOptions {
            buffer_size: 8192,
            ..LoadOptions::default()
        },
    );
}

fn refused(path: &Path, bytes: &[u8], needle: &str) {
    std::fs::write(path, bytes).unwrap();
    let heap = MemfdHeap::new(HugePages::None);
    match load_safetensors(path, &heap, &LoadOptions::default(), &mut |_| {}) {
        Err(Error::Safetensors { reason, .. }) => {
            assert!(reason.contains(needle), "{reason:?} lacks {needle:?}")
        }
        other => panic!("{needle}: {other:?}"),
    }
}

fn with_header(json: &str, data: usize) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out.extend(std::iter::repeat_n(7u8, data));
    out
}

#[test]
fn hostile_headers_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.safetensors");
    refused(&p, b"abc", "too short for the 8-byte header length");
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    refused(&p, &huge, "over the limit of 100000000 bytes");
    let mut past = 5000u64.to_le_bytes().to_vec();
    past.extend_from_slice(b"{}");
    refused(&p, &past, "runs past the end of the file");
    refused(&p, &with_header("{not json", 0), "header refused");
    refused(
        &p,
        &with_header(
            r#"{"x":{"dtype":"X99","shape":[1],"data_offsets":[0,1]}}"#,
            1,
        ),
        "unknown variant `X99`",
    );
    // Overlapping offsets.
    refused(
        &p,
        &with_header(
            r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}"#,
            12,
        ),
        "invalid offset for tensor",
    );
    // Data past the end of the file.
    refused(
        &p,
        &with_header(
            r#"{"a":{"dtype":"F32","shape":[1000],"data_offsets":[0,4000]}}"#,
            100,
        ),
        "the tensors' data ends at byte",
    );
    // Shape and size disagree.
    refused(
        &p,
        &with_header(
            r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8,
        ),
        "header refused",
    );
    // A shape whose element count overflows.
    refused(
        &p,
        &with_header(
            r#"{"a":{"dtype":"F64","shape":[18446744073709551615,16],"data_offsets":[0,8]}}"#,
            8,
        ),
        "header refused",
    );
}
