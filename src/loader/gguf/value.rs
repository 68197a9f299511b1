//! GGUF metadata values ([`GgufValue`]) and their type ids.

/// A GGUF metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// All elements have one type (the writer panics otherwise); an empty array is written
    /// as an array of u8.
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// GGUF value types (`enum gguf_type`): the discriminant is the type id in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum GgufType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufType {
    /// Every type, by id.
    const ALL: [GgufType; 13] = {
        use GgufType::*;
        [U8, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64]
    };

    /// The type of id `id` (None: no GGUF type has it).
    pub fn from_id(id: u32) -> Option<GgufType> {
        Self::ALL.get(id as usize).copied()
    }

    /// The type's name in messages.
    pub fn name(self) -> &'static str {
        ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"][self as usize]
    }
}

impl GgufValue {
    /// The value's GGUF type.
    pub fn ty(&self) -> GgufType {
        use GgufType as t;
        match self {
            GgufValue::U8(_) => t::U8,
            GgufValue::I8(_) => t::I8,
            GgufValue::U16(_) => t::U16,
            GgufValue::I16(_) => t::I16,
            GgufValue::U32(_) => t::U32,
            GgufValue::I32(_) => t::I32,
            GgufValue::F32(_) => t::F32,
            GgufValue::Bool(_) => t::Bool,
            GgufValue::String(_) => t::String,
            GgufValue::Array(_) => t::Array,
            GgufValue::U64(_) => t::U64,
            GgufValue::I64(_) => t::I64,
            GgufValue::F64(_) => t::F64,
        }
    }

    /// The GGUF value type id.
    pub fn type_id(&self) -> u32 {
        self.ty() as u32
    }

    /// Any integer value (not bool, not float) as u64, if non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer value as i64, if it fits.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v as i128,
            GgufValue::I8(v) => v as i128,
            GgufValue::U16(v) => v as i128,
            GgufValue::I16(v) => v as i128,
            GgufValue::U32(v) => v as i128,
            GgufValue::I32(v) => v as i128,
            GgufValue::U64(v) => v as i128,
            GgufValue::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// Any float or integer value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Short description for error messages: the value (strings quoted and cut short, arrays
    /// by length) and its type.
    pub fn describe(&self) -> String {
        let value = match (self, self.as_i128()) {
            (_, Some(v)) => v.to_string(),
            (GgufValue::F32(v), _) => v.to_string(),
            (GgufValue::F64(v), _) => v.to_string(),
            (GgufValue::Bool(v), _) => v.to_string(),
            (GgufValue::String(s), _) if s.len() > 40 => return format!("a string of {} bytes", s.len()),
            (GgufValue::String(s), _) => {
                return format!("the string {}", crate::error::one_line(&format!("{s:?}"), 200))
            }
            (GgufValue::Array(a), _) => return format!("an array of {} elements", a.len()),
            _ => unreachable!("every integer value has as_i128"),
        };
        format!("{value} ({})", self.ty().name())
    }
}

macro_rules! value_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for GgufValue {
            fn from(x: $t) -> Self { GgufValue::$v(x) }
        }
        impl From<Vec<$t>> for GgufValue {
            fn from(x: Vec<$t>) -> Self { GgufValue::Array(x.into_iter().map(GgufValue::$v).collect()) }
        }
        impl From<&[$t]> for GgufValue {
            fn from(x: &[$t]) -> Self { GgufValue::Array(x.iter().cloned().map(GgufValue::$v).collect()) }
        }
    )*};
}
value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for GgufValue {
    fn from(x: &str) -> Self {
        GgufValue::String(x.to_string())
    }
}
impl From<Vec<&str>> for GgufValue {
    fn from(x: Vec<&str>) -> Self {
        GgufValue::Array(x.into_iter().map(GgufValue::from).collect())
    }
}
impl From<&[&str]> for GgufValue {
    fn from(x: &[&str]) -> Self {
        GgufValue::Array(x.iter().map(|s| GgufValue::from(*s)).collect())
    }
}
