//! Enums whose discriminants are wire ordinals.
//!
//! Each such enum lists its variants once; `ALL`, `ordinal` and `from_ordinal` are generated
//! from that list, so adding a variant cannot leave one of them behind. Exported, so the
//! decision engine's wire enums (e.g. `UnmetReason`) are declared the same way.

/// Declares a fieldless `#[repr(u8)]` enum whose discriminants are the wire ordinals (written
/// `Variant = n,`, in ordinal order), with `ALL`, `ordinal()` and `from_ordinal()`.
#[macro_export]
macro_rules! wire_enum {
    (
        $(#[$attr:meta])*
        $vis:vis enum $name:ident {
            $($(#[$variant_attr:meta])* $variant:ident = $ordinal:literal,)+
        }
    ) => {
        $(#[$attr])*
        #[repr(u8)]
        $vis enum $name {
            $($(#[$variant_attr])* $variant = $ordinal,)+
        }

        impl $name {
            /// Every value, in ordinal order.
            pub const ALL: [$name; [$(stringify!($variant)),+].len()] = [$($name::$variant),+];

            /// The wire ordinal.
            pub const fn ordinal(self) -> u8 {
                self as u8
            }

            /// The value with this wire ordinal, or `None` when out of range.
            pub const fn from_ordinal(ordinal: i32) -> Option<$name> {
                match ordinal {
                    $($ordinal => Some($name::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use crate::{
        ActionKind, CapacityType, MachineState, Operator, PenaltyBucket, WhenUnsatisfiable,
    };

    /// `ALL` is strictly ordered by ordinal, and `from_ordinal` answers exactly its ordinals.
    fn check<T: Copy + PartialEq + std::fmt::Debug>(
        all: &[T],
        ordinal: fn(T) -> u8,
        from_ordinal: fn(i32) -> Option<T>,
    ) {
        assert!(
            all.windows(2).all(|w| ordinal(w[0]) < ordinal(w[1])),
            "{all:?}"
        );
        for &v in all {
            assert_eq!(from_ordinal(i32::from(ordinal(v))), Some(v));
        }
        let known = (-1..=i32::from(u8::MAX))
            .filter(|&o| from_ordinal(o).is_some())
            .count();
        assert_eq!(known, all.len(), "{all:?}");
    }

    #[test]
    fn every_wire_enum_round_trips_its_ordinals() {
        check(
            &MachineState::ALL,
            MachineState::ordinal,
            MachineState::from_ordinal,
        );
        check(
            &PenaltyBucket::ALL,
            PenaltyBucket::ordinal,
            PenaltyBucket::from_ordinal,
        );
        check(&Operator::ALL, Operator::ordinal, Operator::from_ordinal);
        check(
            &CapacityType::ALL,
            CapacityType::ordinal,
            CapacityType::from_ordinal,
        );
        check(
            &WhenUnsatisfiable::ALL,
            WhenUnsatisfiable::ordinal,
            WhenUnsatisfiable::from_ordinal,
        );
        check(
            &ActionKind::ALL,
            ActionKind::ordinal,
            ActionKind::from_ordinal,
        );
        assert_eq!(Operator::ALL.len(), 6);
        assert_eq!(CapacityType::ALL.len(), 5);
        assert_eq!(WhenUnsatisfiable::ALL.len(), 3);
        assert_eq!(ActionKind::ALL.len(), 5);
    }
}
