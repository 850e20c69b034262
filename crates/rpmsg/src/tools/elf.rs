//! Just enough of an ELF header to tell whether the dynamic loader runs a
//! program (and so honours `LD_PRELOAD`): a pure parser of untrusted bytes
//! that answers or errs, never panics (see `elf(5)`).

use thiserror::Error;

/// What an executable is, as far as preloading goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linkage {
    /// An ELF file with an interpreter (`PT_INTERP`): the dynamic loader
    /// runs it and honours `LD_PRELOAD`.
    Dynamic,
    /// An ELF file without one: statically linked, nothing is preloaded.
    Static,
    /// Not ELF (a script: its interpreter is what gets preloaded).
    NotElf,
}

/// Why an ELF header could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ElfError {
    /// `e_ident[EI_CLASS]` is neither ELFCLASS32 nor ELFCLASS64.
    #[error("Bad ELF class")]
    Class,
    /// `e_ident[EI_DATA]` is neither little- nor big-endian.
    #[error("Bad ELF data encoding")]
    Encoding,
    /// A field lies past the bytes given.
    #[error("Truncated ELF header at byte {offset}")]
    Truncated {
        /// Where the field starts.
        offset: u64,
    },
    /// The program header table's position overflows.
    #[error("Bad program headers")]
    ProgramHeaders,
}

/// `p_type` of the program header naming the interpreter.
const PT_INTERP: u64 = 3;

/// Reads `bytes` (the start of an executable) as ELF and says whether it
/// names an interpreter.
///
/// # Errors
/// [`ElfError`] for a malformed or truncated header.
pub fn linkage(bytes: &[u8]) -> Result<Linkage, ElfError> {
    if bytes.len() < 4 || bytes[..4] != *b"\x7fELF" {
        return Ok(Linkage::NotElf);
    }
    let get = |at: u64, n: usize| -> Result<u64, ElfError> {
        let b = usize::try_from(at)
            .ok()
            .and_then(|s| bytes.get(s..s.checked_add(n)?))
            .ok_or(ElfError::Truncated { offset: at })?;
        let mut v = [0u8; 8];
        match bytes.get(5) {
            Some(1) => v[..n].copy_from_slice(b),
            Some(2) => {
                for (i, x) in b.iter().rev().enumerate() {
                    v[i] = *x;
                }
            }
            _ => return Err(ElfError::Encoding),
        }
        Ok(u64::from_le_bytes(v))
    };
    // (e_phoff, e_phentsize, e_phnum) for ELF32 and ELF64.
    let (phoff, phentsize, phnum) = match bytes.get(4) {
        Some(1) => (get(28, 4)?, get(42, 2)?, get(44, 2)?),
        Some(2) => (get(32, 8)?, get(54, 2)?, get(56, 2)?),
        _ => return Err(ElfError::Class),
    };
    for i in 0..phnum {
        let at = i
            .checked_mul(phentsize)
            .and_then(|o| phoff.checked_add(o))
            .ok_or(ElfError::ProgramHeaders)?;
        if get(at, 4)? == PT_INTERP {
            return Ok(Linkage::Dynamic);
        }
    }
    Ok(Linkage::Static)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linkage_of_real_and_broken_files() {
        // This test binary is dynamically linked (it has an interpreter).
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(linkage(&me), Ok(Linkage::Dynamic));
        assert_eq!(linkage(b"#!/bin/sh\n"), Ok(Linkage::NotElf));
        assert!(linkage(b"\x7fELF").is_err());
        assert!(linkage(&me[..40]).is_err());
        // No program headers at all: nothing names an interpreter.
        let mut none = me[..64].to_vec();
        none[56] = 0;
        none[57] = 0;
        assert_eq!(linkage(&none), Ok(Linkage::Static));
        // Any prefix of a real file, and garbage after the magic: an
        // answer or an error, never a panic.
        for n in (0..me.len().min(4096)).step_by(7) {
            let _ = linkage(&me[..n]);
        }
        let mut junk = me[..64].to_vec();
        junk[32..40].fill(0xff);
        assert!(linkage(&junk).is_err());
    }
}
