//! Typed properties, as libblkio names and types them.

use crate::{Error, Result};

/// The one type a property has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropType {
    /// C `bool` (`blkio_get_bool`/`blkio_set_bool`).
    Bool,
    /// C `int` (32-bit).
    Int,
    /// C `uint64_t` (`blkio_get_uint64`/`blkio_set_uint64`).
    U64,
    /// NUL-terminated string (`blkio_get_str`/`blkio_set_str`).
    Str,
}

/// A property value; the variant is the value's [`PropType`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PropValue {
    /// A [`PropType::Bool`] value.
    Bool(bool),
    /// A [`PropType::Int`] value.
    Int(i32),
    /// A [`PropType::U64`] value.
    U64(u64),
    /// A [`PropType::Str`] value.
    Str(String),
}

impl PropValue {
    /// The value's type.
    pub fn ty(&self) -> PropType {
        match self {
            PropValue::Bool(_) => PropType::Bool,
            PropValue::Int(_) => PropType::Int,
            PropValue::U64(_) => PropType::U64,
            PropValue::Str(_) => PropType::Str,
        }
    }
    /// Format as `blkio_get_str` does (`true`/`false`, decimal integers).
    pub fn to_display_string(&self) -> String {
        match self {
            PropValue::Bool(b) => b.to_string(),
            PropValue::Int(i) => i.to_string(),
            PropValue::U64(u) => u.to_string(),
            PropValue::Str(s) => s.clone(),
        }
    }
    /// Parse a string into a value of type `ty`, with libblkio's strict parsers and messages.
    pub fn parse(ty: PropType, s: &str) -> Result<PropValue> {
        match ty {
            PropType::Bool => match s {
                "true" => Ok(PropValue::Bool(true)),
                "false" => Ok(PropValue::Bool(false)),
                _ => Err(Error::inval("Value must be \"true\" or \"false\"")),
            },
            PropType::Int => s
                .parse::<i32>()
                .map(PropValue::Int)
                .map_err(|_| Error::inval("Value must be a signed 32-bit integer")),
            PropType::U64 => s
                .parse::<u64>()
                .map(PropValue::U64)
                .map_err(|_| Error::inval("Value must be an unsigned 64-bit integer")),
            PropType::Str => Ok(PropValue::Str(s.to_owned())),
        }
    }
}

/// When a property may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Never writable.
    ReadOnly,
    /// Writable in the created state only.
    RwCreated,
    /// Writable in the connected state only.
    RwConnected,
}

/// Static description of one property.
#[derive(Debug, Clone, Copy)]
pub struct PropSpec {
    /// The libblkio property name, kebab-case (e.g. `request-alignment`, `num-entries`).
    pub name: &'static str,
    /// The one type the property is read and written as.
    pub ty: PropType,
    /// In which state the property may be written.
    pub access: Access,
    /// A get in the created state fails with ENODEV `Device must be connected`.
    pub needs_connect: bool,
}

impl PropSpec {
    /// A spec from its parts, usable in a `const` table such as [`crate::Driver::props`].
    pub const fn new(
        name: &'static str,
        ty: PropType,
        access: Access,
        needs_connect: bool,
    ) -> Self {
        PropSpec {
            name,
            ty,
            access,
            needs_connect,
        }
    }
}
