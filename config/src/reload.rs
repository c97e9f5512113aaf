//! What a reload needs beyond the typed config: which top-level keys the file wrote (a key
//! left out and a key set to its default look alike once parsed) and whether its last line
//! is whole, plus the `[dataplane]` keys in which two configs differ. The daemon's
//! controller decides with these whether a reloaded file is complete (see its module doc).

use std::collections::BTreeSet;
use std::path::Path;

use crate::schema::Dataplane;
use crate::{Config, Error};

/// What a file wrote explicitly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Its top-level keys and tables (`dataplane`, `services`, ...); none for an empty file
    /// or one of only whitespace and comments.
    pub keys: BTreeSet<String>,
    /// The text is empty or ends with a newline. A file cut mid-line (a write in progress)
    /// may still parse: `port = 8` of `port = 8080`.
    pub ends_with_newline: bool,
}

impl Written {
    /// Whether the file wrote the top-level key or table `key`.
    pub fn has(&self, key: &str) -> bool {
        self.keys.contains(key)
    }

    /// Why a reload refuses this file whatever the running config is: it is empty, or its
    /// last line is cut. The daemon's controller refuses such a reload; `xvs check` refuses
    /// such a file, which could start xvs but never reload it.
    pub fn incomplete(&self) -> Option<&'static str> {
        if self.keys.is_empty() {
            return Some(
                "the file is empty (nothing but whitespace or comments): a reload needs the complete config",
            );
        }
        if !self.ends_with_newline {
            return Some(
                "the file's last line has no newline: it looks cut short (a write in progress?); replace the file atomically (write a temporary file, then rename it over this one) and end it with a newline",
            );
        }
        None
    }
}

/// [`crate::parse`], and what the text wrote explicitly.
pub fn parse_written(text: &str, file: &str) -> Result<(Config, Written), Error> {
    let config = crate::parse(text, file)?;
    // It parsed above, so it parses here.
    let keys = toml::de::DeTable::parse(text)
        .map(|doc| {
            doc.get_ref()
                .iter()
                .map(|(k, _)| k.get_ref().to_string())
                .collect()
        })
        .unwrap_or_default();
    let written = Written {
        keys,
        ends_with_newline: text.is_empty() || text.ends_with('\n'),
    };
    Ok((config, written))
}

/// [`crate::load`], and what the file wrote explicitly.
pub fn load_written(path: &Path) -> Result<(Config, Written), Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_written(&text, &path.display().to_string())
}

impl Dataplane {
    /// The keys (`dataplane.interfaces`, ...) whose values differ between `self` and
    /// `other`, in the order of the schema.
    pub fn differences(&self, other: &Dataplane) -> Vec<&'static str> {
        // Destructured with the same list that is compared, so that a new key cannot be
        // forgotten here (a field missing from the list fails the build).
        macro_rules! differences {
            ($($key:ident),* $(,)?) => {{
                let Dataplane { $($key),* } = self;
                let mut out = Vec::new();
                $(
                    if *$key != other.$key {
                        out.push(concat!("dataplane.", stringify!($key)));
                    }
                )*
                out
            }};
        }
        differences!(
            interfaces,
            allow_fewer_queues,
            cores,
            slowpath_core,
            mode,
            snat_addresses,
            snat_port_range,
            umem_frames,
            frame_size,
            rx_ring_size,
            tx_ring_size,
            batch_size,
            xdp_mode,
            zero_copy,
            idle_backoff,
            napi_busy_poll,
            pass_to_kernel,
            mh_table_size,
            drain_timeout,
            state_dir,
            restart_hold,
            bpf_pin_root,
            reject_rate,
            reject_burst,
            gue_port,
            ipip_source_prefix,
            dsr_mss_clamp,
            dsr_mtu,
        )
    }
}
