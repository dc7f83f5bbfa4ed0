//! Fuzzes the GGUF reader: any byte string must give `Ok` or `Err`, never a panic or an
//! out-of-bounds read, and every tensor of a file that parses must be readable with
//! exactly its declared size.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = engine::gguf::GgufFile::from_bytes(data.to_vec()) {
        for info in file.tensor_infos() {
            match file.tensor(&info.name) {
                Ok(t) => assert_eq!(t.data.len() as u64, info.size),
                Err(e) => panic!("listed tensor {} unreadable: {e}", info.name),
            }
        }
        let _ = file.metadata().architecture();
    }
});
