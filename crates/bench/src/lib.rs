//! fio/IOzone-class benchmark engine over snapblk devices.
