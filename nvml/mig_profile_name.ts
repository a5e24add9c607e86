/**
 * The name nvidia-smi gives a MIG profile (`3g.20gb`, `1c.3g.20gb`, `1g.10gb+me`), from the slices and
 * memory NVML reports and the card's total memory.
 *
 * @module
 */

const MIB = 2 ** 20;
const GIB = 2 ** 30;

/**
 * The profile's memory in the whole gigabytes its name shows: its share of the card, rounded up to
 * eighths (the card's memory slices), times the card's memory in GiB rounded up.
 */
export function migMemoryGb(memorySizeMb: number, cardTotalBytes: number): number {
  const eighths = Math.ceil(((memorySizeMb * MIB) / cardTotalBytes) * 8);
  return Math.round((eighths / 8) * Math.ceil(cardTotalBytes / GIB));
}

/**
 * `<gi>g.<gb>gb` with `suffix`, or `<ci>c.<gi>g.<gb>gb` for a compute instance smaller than its GPU
 * instance; throws a RangeError for a card total that is not positive (no name can be derived).
 */
export function migProfileName(
  slices: { readonly gpuInstance: number; readonly computeInstance?: number },
  memorySizeMb: number,
  cardTotalBytes: number,
  suffix = "",
): string {
  if (!(cardTotalBytes > 0)) {
    throw new RangeError(`a card of ${cardTotalBytes} bytes has no MIG profile names`);
  }
  const gb = migMemoryGb(memorySizeMb, cardTotalBytes);
  const ci = slices.computeInstance;
  const prefix = ci !== undefined && ci < slices.gpuInstance ? `${ci}c.` : "";
  return `${prefix}${slices.gpuInstance}g.${gb}gb${suffix}`;
}
